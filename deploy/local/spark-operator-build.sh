#!/usr/bin/env bash
# Build the Kubeflow Spark operator (controller binary) from its published Go module, and
# keep its Helm chart beside it, for the Spark image (deploy/local/images.sh spark) and the
# cluster tier's Spark test.
#
# The Go module proxy refuses to list this module's versions (`@latest` and `@v/list` answer
# 403) but serves an exact version, hence the pinned SPARK_OPERATOR_VERSION. The binary and the
# chart land in $BN_CACHE/spark-operator/<version>/; a second run reuses them in a second.
SERVICE=spark-operator-build
source "$(dirname "$0")/lib.sh"

SPARK_OPERATOR_VERSION=${SPARK_OPERATOR_VERSION:-v2.3.0}
module=github.com/kubeflow/spark-operator/v2
out="$BN_CACHE/spark-operator/$SPARK_OPERATOR_VERSION"
if [[ -x $out/spark-operator && -f $out/chart/Chart.yaml ]]; then
  echo "$out"
  exit 0
fi
command -v go >/dev/null || die "go is required to build the Spark operator"
mkdir -p "$out"
log "building the Spark operator $SPARK_OPERATOR_VERSION (first run only; 82 s on two cores with empty Go caches)"
started=$SECONDS
dir=$(GOFLAGS=-mod=mod go mod download -json "$module@$SPARK_OPERATOR_VERSION" |
  python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("Dir") or sys.exit(d.get("Error")))')
# The module cache is read-only, and the build needs the module's own go.mod (with its
# replace directives), so it runs in a writable copy.
work="$BN_CACHE/spark-operator/build-$SPARK_OPERATOR_VERSION"
rm -rf "$work"
cp -r "$dir" "$work"
chmod -R u+w "$work"
(
  cd "$work"
  GOFLAGS=-mod=mod CGO_ENABLED=0 go build -p 2 -trimpath \
    -ldflags "-s -w -X $module.version=$SPARK_OPERATOR_VERSION" \
    -o "$out/spark-operator.tmp" ./cmd/operator
)
rm -rf "$out/chart"
cp -r "$work/charts/spark-operator-chart" "$out/chart"
mv "$out/spark-operator.tmp" "$out/spark-operator"
rm -rf "$work"
log "built $out/spark-operator ($(du -h "$out/spark-operator" | cut -f1)) in $((SECONDS - started)) s"
echo "$out"
