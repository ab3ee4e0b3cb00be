# bucketnotify developer commands. `make test` is what CI runs (.ci/run).
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
LOCAL := deploy/local
SERVICES := kube ceph rabbitmq rabbitmq-mtls kafka
# The Ceph releases besides the default (tentacle, 20.2) that the compatibility tier runs the
# gateway-facing tests against (deploy/local/ceph.sh, CEPH_RELEASE).
COMPAT_RELEASES ?= reef pacific
COMPAT_LOG ?= $(or $(BN_RUN),/tmp/bucketnotify-local)/compat
COMPAT_TESTS := \
	tests/integration/test_rgw_smoke.py \
	tests/integration/test_release_behaviour.py \
	tests/integration/test_gateway_notifications.py \
	tests/integration/test_gateway_contention.py \
	tests/integration/test_key_regex_on_gateway.py \
	tests/integration/test_filter_semantics.py \
	tests/integration/test_topic_listing.py \
	tests/integration/test_topic_names.py::test_a_topic_holding_a_dotted_name_keeps_it_where_the_gateway_takes_it_and_moves_where_not \
	tests/integration/test_topic_names.py::test_a_spec_name_with_a_dot_is_taken_or_refused_as_the_gateways_release_says \
	tests/integration/test_topic_operator.py::test_each_endpoint_kind_reaches_the_gateway \
	tests/integration/test_topic_operator.py::test_drift_on_the_gateway_is_repaired \
	tests/integration/test_topic_operator.py::test_tls_and_sasl_settings_reach_the_gateway \
	tests/integration/test_topic_operator.py::test_sasl_settings_reach_a_gateway_over_https \
	tests/integration/test_notification_operator.py::test_notification_is_applied_with_every_filter_and_sends_a_test_event \
	tests/integration/test_notification_operator.py::test_foreign_configuration_survives_reconcile_and_delete \
	tests/integration/test_notification_operator.py::test_a_failed_push_of_a_gateway_delivered_topic_does_not_fail_the_put_and_is_gone \
	tests/e2e/test_events.py::test_every_event_type_arrives_with_the_reference_fields \
	tests/e2e/test_persistent_delivery.py::test_every_event_type_is_delivered_once_with_the_gateways_fields \
	tests/e2e/test_persistent_delivery.py::test_events_arrive_once_and_in_order_per_object \
	tests/spark/test_s3a.py::test_records_on_the_gateway

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

$(BIN)/.installed: pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c requirements.lock -e '.[dev,report]'
	touch $@

.PHONY: install
install: $(BIN)/.installed ## create .venv with the project and its dev dependencies

.PHONY: services-install
services-install: ## install or build every local service once (apt packages, kube-apiserver, Kafka jars, the Ceph releases' roots)
	@for s in $(SERVICES); do bash $(LOCAL)/$$s.sh install; done
	@for r in $(COMPAT_RELEASES); do CEPH_RELEASE=$$r bash $(LOCAL)/ceph.sh install; done

.PHONY: tools helm
tools: helm ## build the CLIs the tests use besides the services (helm and promtool, from their Go modules)
	bash $(LOCAL)/promtool.sh install

helm: ## build helm from its Go module (once)
	bash $(LOCAL)/helm.sh install

.PHONY: services-up
services-up: services-install ## start the real local services (reuses running ones)
	@for s in $(SERVICES); do bash $(LOCAL)/$$s.sh start; done

.PHONY: services-down
services-down: ## stop the local services (the gateways of every Ceph release included)
	@for s in $(SERVICES); do bash $(LOCAL)/$$s.sh stop || true; done
	@for r in $(COMPAT_RELEASES); do CEPH_RELEASE=$$r bash $(LOCAL)/ceph.sh stop || true; done

.PHONY: lint
lint: install ## ruff (lint and format check), mypy strict, import layers
	$(BIN)/ruff check operator spark devstack tests bench demo
	$(BIN)/ruff format --check operator spark devstack tests bench demo
	$(BIN)/mypy
	$(BIN)/lint-imports

.PHONY: fmt
fmt: install ## format the code
	$(BIN)/ruff check --fix operator spark devstack tests bench demo
	$(BIN)/ruff format operator spark devstack tests bench demo

.PHONY: crds
crds: install helm ## regenerate crds/ from the API models, and the chart's copy and deploy/base with them
	$(BIN)/python -m bucketnotify.api.crds crds
	rm -f charts/bucketnotify/files/crds/*.yaml && cp crds/*.yaml charts/bucketnotify/files/crds/
	$(BIN)/python -m tests.install.manifests

.PHONY: crds-check
crds-check: install ## fail when crds/ is not what the API models generate
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(BIN)/python -m bucketnotify.api.crds "$$tmp"; \
	diff -ru crds "$$tmp" || { echo "crds/ is out of date: run 'make crds'"; exit 1; }
	@diff -ru crds charts/bucketnotify/files/crds || { echo "the chart's CRDs are out of date: run 'make crds'"; exit 1; }

.PHONY: manifests
manifests: install helm ## render deploy/base/bucketnotify.yaml from the Helm chart's defaults
	$(BIN)/python -m tests.install.manifests

.PHONY: lock
lock: install ## rewrite requirements.lock from pyproject.toml, keeping its pins where they still fit (UPGRADE=1: the newest of everything)
	$(BIN)/uv pip compile pyproject.toml --extra report --extra dev --python-version 3.11 \
	  $(if $(UPGRADE),--upgrade) -q -o requirements.lock

.PHONY: test-unit
test-unit: install ## unit tests only (no services)
	$(BIN)/pytest tests/unit

.PHONY: test
test-prerequisites: install services-install tools node-install python-install lint crds-check

test: ## lint, crds check, every test against the real services (Ceph 20.2), the gateway-facing ones against Ceph 18.2 and 16.2, the unit tests on Python 3.13, then the chart on the one-node cluster
	@# Two at a time: on a new machine the Go builds (kube-apiserver, kubelet, helm) keep the
	@# cores busy while the downloads (Python packages, Ceph roots, Kafka's jars) wait on the
	@# network; on a machine that has them all it takes seconds.
	$(MAKE) --no-print-directory -j2 test-prerequisites
	@# Each always runs: the suite on the default Ceph release, its two lanes side by side
	@# and then the fault tier alone (its timing must not share the cores); then the
	@# compatibility tier, a session per other release side by side, sharing the first
	@# session's apiserver and brokers, and beside them the unit tests on Python 3.13; then the
	@# one-node cluster (kubelet, controller-manager, five pods), which runs only while its
	@# own tier does.
	rc=0; \
	$(MAKE) --no-print-directory lanes-side-by-side || rc=1; \
	BN_KEEP_SERVICES=1 $(BIN)/pytest -ra --durations=10 tests/faults || rc=1; \
	$(MAKE) --no-print-directory compat-side-by-side || rc=1; \
	$(MAKE) --no-print-directory services-down; \
	$(BIN)/pytest -ra --durations=10 tests/cluster || rc=1; \
	exit $$rc

# Every tier but the fault and cluster tiers, in two sessions at once against the same
# services (started first: two sessions starting them at once would restart the apiserver
# under each other). Each test has its own namespace, buckets, topics and replicas, so the
# lanes never meet; a serial run left half of two cores idle. Their output is printed one
# after the other.
LANES := tests/integration tests/e2e+tests/spark+tests/install+tests/unit
LANES_LOG ?= $(or $(BN_RUN),/tmp/bucketnotify-local)/lane

.PHONY: lanes-side-by-side
lanes-side-by-side: services-up
	@rc=0; pids=(); n=0; mkdir -p "$(dir $(LANES_LOG))"; \
	for lane in $(LANES); do \
	  n=$$((n + 1)); \
	  BN_KEEP_SERVICES=1 $(BIN)/pytest -ra --durations=15 $${lane//+/ } \
	    >"$(LANES_LOG)-$$n.log" 2>&1 & pids+=($$!); \
	done; \
	for p in "$${pids[@]}"; do wait "$$p" || rc=1; done; \
	n=0; for lane in $(LANES); do \
	  n=$$((n + 1)); echo "== lane $$n: $${lane//+/ }"; cat "$(LANES_LOG)-$$n.log"; \
	done; \
	exit $$rc

# The releases' sessions run at once: each has its own gateway, and every test its own
# namespace, operator and replicas (scoped to it), so they share the apiserver and the brokers
# without meeting; beside them the unit tier on Python 3.13 (no services). Their output is
# printed one after the other.
.PHONY: compat-side-by-side
compat-side-by-side:
	@rc=0; pids=(); mkdir -p "$(dir $(COMPAT_LOG))"; \
	for r in $(COMPAT_RELEASES); do \
	  CEPH_RELEASE=$$r BN_KEEP_SERVICES=1 $(BIN)/pytest -ra --durations=5 $(COMPAT_TESTS) \
	    >"$(COMPAT_LOG)-$$r.log" 2>&1 & pids+=($$!); \
	done; \
	bash $(LOCAL)/python.sh test -q tests/unit >"$(COMPAT_LOG)-python.log" 2>&1 & pids+=($$!); \
	for p in "$${pids[@]}"; do wait "$$p" || rc=1; done; \
	for r in $(COMPAT_RELEASES); do echo "== compatibility tier, Ceph $$r"; cat "$(COMPAT_LOG)-$$r.log"; done; \
	echo "== compatibility tier, the unit tests on $$(bash $(LOCAL)/python.sh version)"; \
	cat "$(COMPAT_LOG)-python.log"; \
	exit $$rc

.PHONY: python-install
python-install: ## a Debian trixie root with Python 3.13 and the project's dependencies, for the unit tier on it (once)
	bash $(LOCAL)/python.sh install

.PHONY: test-python
test-python: python-install ## the unit tests on Python 3.13 (deploy/local/python.sh)
	bash $(LOCAL)/python.sh test tests/unit

.PHONY: test-compat
test-compat: install services-install ## the compatibility tier alone: the gateway-facing tests against each of COMPAT_RELEASES
	rc=0; \
	for r in $(COMPAT_RELEASES); do CEPH_RELEASE=$$r $(BIN)/pytest -ra $(COMPAT_TESTS) || rc=1; done; \
	exit $$rc

.PHONY: node-install
node-install: ## the one-node cluster's packages and binaries, our image's base and the Spark operator (once)
	bash $(LOCAL)/node.sh install
	bash $(LOCAL)/spark-operator-build.sh >/dev/null

.PHONY: test-cluster
test-cluster: install services-install tools node-install ## the chart on a real one-node cluster (kubelet, containerd): tests/cluster
	$(BIN)/pytest -ra tests/cluster

.PHONY: cluster-down
cluster-down: ## stop the one-node cluster and undo what it changed on the host
	bash $(LOCAL)/node.sh stop

RAMP ?= 1,8,32,64
RAMP_EVENTS ?= 500
RAMP_SCENARIOS ?= gateway-sync,gateway-persistent,relay-sync,bucketnotify-sync,bucketnotify-sync-s3

.PHONY: bench
bench: install services-install ## the ingest alone, delivery vs the gateway (and a ramp of clients: RAMP), idle cost, failover, operator at scale, delivery status writes at 1,000 Topics, the whole system at 10,000 + 10,000 objects (BENCH_ARGS, IDLE_ARGS, FAILOVER_ARGS="--rounds 1", OPERATOR_ARGS="--topics 100 --notifications 100", STATUS_ARGS="--topics 200", SCALE_ARGS="--topics 1000 --notifications 1000 --buckets 100")
	@# Each runs even when one before it failed: the figures of the others are still worth having.
	rc=0; \
	$(BIN)/python -m bench.ingest || rc=1; \
	$(BIN)/python -m bench.delivery $(BENCH_ARGS) || rc=1; \
	$(BIN)/python -m bench.delivery --ramp $(RAMP) --events $(RAMP_EVENTS) --scenarios $(RAMP_SCENARIOS) || rc=1; \
	$(BIN)/python -m bench.idle $(IDLE_ARGS) || rc=1; \
	$(BIN)/python -m bench.failover $(FAILOVER_ARGS) || rc=1; \
	$(BIN)/python -m bench.operator_scale $(OPERATOR_ARGS) || rc=1; \
	$(BIN)/python -m bench.status_writes $(STATUS_ARGS) || rc=1; \
	$(BIN)/python -m bench.scale $(SCALE_ARGS) || rc=1; \
	exit $$rc

REPORT_OUT ?= /tmp/bucketnotify-local/report

.PHONY: report
report: install ## the Spark report (local[*]) of RECORDS=<dir or s3a://bucket/prefix> for DATE=YYYY-MM-DD (default yesterday) into REPORT_OUT; docs/report.md
	@test -n "$(RECORDS)" || { echo "RECORDS=<records prefix holding v1/> is required, see docs/report.md"; exit 2; }
	$(BIN)/python -m bucketnotify_report --input "$(RECORDS)" --output "$(REPORT_OUT)" $(if $(DATE),--date $(DATE))

.PHONY: demo
demo: install services-up ## the system on this machine: services, operator, 2 delivery replicas, the samples, events arriving, stats, metrics, Spark report
	$(BIN)/python -m demo up

.PHONY: demo-down
demo-down: ## stop what `make demo` started, the local services included
	$(BIN)/python -m demo down

.PHONY: clean
clean: services-down ## stop services and remove the venv and caches in the repo
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
