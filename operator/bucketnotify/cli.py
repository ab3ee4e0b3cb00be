"""Command-line entry points: ``bucketnotify operator|delivery|topic|notification``."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

import aiohttp
import kopf
import shtab
import uvloop

from bucketnotify import __version__, admin, logs
from bucketnotify.admission import PATH as ADMISSION_PATH
from bucketnotify.admission import serve_admission
from bucketnotify.controller import handlers
from bucketnotify.controller.drift_loop import ObjectLocks
from bucketnotify.controller.finalizers import FINALIZER
from bucketnotify.controller.handlers import WATCHED_RESOURCES
from bucketnotify.controller.notifications import BucketLocks
from bucketnotify.delivery.service import run_replica
from bucketnotify.delivery_health import LEASE_GROUP
from bucketnotify.gateway.pool import GatewayPool
from bucketnotify.kube.apiserver import (
    LEASE_CONNECTIONS,
    ApiClient,
    ApiError,
    ConfigError,
    connection_info,
    proxy_for,
)
from bucketnotify.kube.event_recorder import EventRecorder
from bucketnotify.kube.leadership import lead
from bucketnotify.kube.objects import WATCHED_LABEL, Kube, connect
from bucketnotify.kube.watched_secrets import WatchedSecrets
from bucketnotify.metrics import OperatorMetrics
from bucketnotify.probes import serve_probes
from bucketnotify.settings import (
    DeliveryServiceSettings,
    LogSettings,
    OperatorSettings,
    default_identity,
)

__all__ = ["main"]

log = logging.getLogger("bucketnotify")

API_CONNECTIONS = 24
"""kopf's connections for its requests (patches, reads) at most, beside one per watch stream
(``kopf_connections``). Its own session has no limit: at 2,000 objects it kept about 230
connections open, each with a 256 KiB TLS buffer; the operator's status patches and reads
queue for a free one instead."""

OBSERVER_STREAMS = 2
"""kopf's watch streams besides the handlers': CustomResourceDefinitions (its resource
scanning) and, when namespaces are listed, Namespaces."""


def kopf_connections(namespaces: Sequence[str]) -> int:
    """The bound of kopf's connection pool: one connection for each watch stream kopf keeps
    open (one per watched resource in each watched namespace, plus its observers) and
    ``API_CONNECTIONS`` for everything else.

    A stream holds its connection for as long as it runs. A bound that did not count them
    let the streams take every connection from 8 namespaces on (24 connections, 3 streams
    per namespace), and every request of kopf waited for one forever: nothing reconciled.
    The pool grows with the namespaces listed, never with the objects in them."""
    return API_CONNECTIONS + OBSERVER_STREAMS + len(WATCHED_RESOURCES) * max(1, len(namespaces))


OPERATOR_COMPONENT = "bucketnotify-operator"
"""The operator's Events' source (the delivery service's: ``bucketnotify-delivery``)."""


def _configure_kopf(settings: kopf.OperatorSettings, **_: Any) -> None:
    # Leader election (a Lease) decides who acts, so kopf's own peering objects are not used.
    settings.peering.standalone = True
    # Our Events go through EventRecorder, which counts a repeated one up instead of posting
    # another (kopf's posting makes a new Event object per call).
    settings.posting.enabled = False
    # Progress annotations keep handler state while status belongs to our handlers. Their own
    # domain: kopf leaves its annotations out of diffs, and our bucketnotify.io/ resync
    # markers must trigger update handlers.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix="kopf.bucketnotify.io"
    )
    # The diff base goes with the handler's own status write, one PATCH of the status; as an
    # annotation it cost a second PATCH of the object and a second watch event per change
    # (objects reconciled before keep their old annotation, unused: the first run after an
    # upgrade handles each object once more, as a resume does).
    settings.persistence.diffbase_storage = kopf.StatusDiffBaseStorage(
        field=f"status.{handlers.DIFF_BASE_FIELD}"
    )
    # Server-side: the API server sends only the Secrets the operator labelled, not every
    # Secret of the cluster (kopf's handler filters would still receive and parse them all).
    settings.watching.label_selectors["v1", "secrets"] = f"{WATCHED_LABEL}=true"
    # A finalizer in our own domain: an admin looking at a stuck object sees whose it is
    # (releases before 0.1.0 used kopf's default; controller.finalizers moves it).
    settings.persistence.finalizer = FINALIZER


async def _login(memo: Any, **_: Any) -> kopf.AiohttpSession:
    """kopf's login with the credentials our own API client uses, in a session of at most
    ``kopf_connections`` connections."""
    settings: OperatorSettings = memo.settings
    # No expiration: kopf logs in again on a 401, which a rotated token comes to.
    info = dataclasses.replace(await asyncio.to_thread(connection_info), expiration=None)
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(
            limit=kopf_connections(settings.namespaces), ssl=info.as_ssl_context()
        ),
        headers=info.as_http_headers(),
        proxy=proxy_for(info),
        trust_env=False,
    )
    return kopf.AiohttpSession(
        aiohttp_session=session,
        server=info.server,
        default_namespace=info.default_namespace,
        priority=info.priority,
        expiration=info.expiration,
    )


async def run_operator(settings: OperatorSettings) -> None:
    # Closed on every way out, a refused first request included: otherwise asyncio's
    # "Unclosed client session" errors are the log's last lines, below what to fix.
    async with await connect() as api:
        await _operate(settings, api)


async def _operate(settings: OperatorSettings, api: ApiClient) -> None:
    if not settings.owner_id:
        settings = settings.model_copy(update={"owner_id": await Kube(api).cluster_uid()})
    log.info("gateway objects of this operator are marked as owned by %s", settings.owner_id)
    identity = settings.identity or default_identity()
    metrics = OperatorMetrics()
    registry = kopf.get_default_registry()
    kopf.on.startup(registry=registry)(_configure_kopf)
    kopf.on.login(registry=registry)(_login)
    handlers.register_drift_loop(registry, settings.drift_interval_seconds)
    handlers.register_delivery_status(
        registry,
        namespace=settings.delivery_namespace,
        group=LEASE_GROUP,
        interval=settings.delivery_status_interval_seconds,
    )
    kopf.on.cleanup(registry=registry, id="stopping")(_stopping)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    probes = None
    if settings.metrics_port:
        probes = await serve_probes(
            settings.metrics_port,
            metrics.exposition,
            lambda: "stopping" if stop.is_set() else None,
        )
        log.info("operator /metrics, /healthz and /readyz on :%d", settings.metrics_port)
    webhook = None
    if settings.webhook_port:
        webhook = await serve_admission(
            settings.webhook_port, settings.webhook_cert_dir, Kube(api).exists
        )
        log.info("admission webhook on :%d%s (HTTPS)", settings.webhook_port, ADMISSION_PATH)
    events = EventRecorder(api, component=OPERATOR_COMPONENT, instance=identity)
    operator = kopf.operator(
        registry=registry,
        memo=kopf.Memo(
            settings=settings,
            stop=stop,
            events=events,
            kube=Kube(api, label_secrets=True),
            # A drift check may use a bucket read of the last drift interval.
            bucket_locks=BucketLocks(metrics, reuse_s=settings.drift_interval_seconds),
            # A drift check of a Topic may use a topic listing of the last drift interval.
            gateways=GatewayPool(
                listing_reuse_s=settings.drift_interval_seconds,
                release=settings.gateway_release,
                learned=lambda endpoint, release: metrics.gateway_info.labels(
                    endpoint, release.name
                ).set(1),
                counted=lambda operation: metrics.gateway_requests.labels(operation).inc(),
            ),
            object_locks=ObjectLocks(),
            # The drift checks read Secrets from the operator's watch of them.
            watched_secrets=WatchedSecrets(),
            metrics=metrics,
        ),
        clusterwide=not settings.namespaces,
        namespaces=settings.namespaces,
        standalone=True,
        stop_flag=stop,
        # Given, kopf does not derive one from the user database (getpass.getuser()), which
        # has no entry for a container's numeric user.
        identity=identity,  # type: ignore[arg-type]  # kopf does not export its Identity type
    )
    try:
        if settings.leader_election:
            async with await connect(LEASE_CONNECTIONS) as leases:
                await lead(leases, settings, identity, operator, stop, leading=metrics.leader.set)
        else:
            metrics.leader.set(1)  # alone, it leads
            await operator
    finally:
        await events.aclose()
        if webhook is not None:
            await webhook.stop()
        if probes is not None:
            await probes.cleanup()


async def _stopping(memo: kopf.Memo, **_: Any) -> None:
    # kopf puts its own SIGTERM handler in place of ours, so only this tells the rest of
    # the process that kopf is stopping: /readyz answers 503 from here on. It also ends
    # the tasks kopf would otherwise wait 5 s for before cancelling them (every task made
    # after its start counts as one of its own): its waiter on our stop flag and the Event
    # writer's waits (each operator stop would take 5 s longer). What is recorded later
    # is written by the final close once kopf has returned.
    memo.stop.set()
    await memo.events.aclose()


def _program() -> str:
    # Installed as kubectl-bucketnotify too: kubectl runs it as the plugin `kubectl
    # bucketnotify`, and the usage lines should say what the user typed.
    if os.path.basename(sys.argv[0]).startswith("kubectl-"):
        return "kubectl bucketnotify"
    return "bucketnotify"


def build_parser() -> argparse.ArgumentParser:
    """Every command and option of the ``bucketnotify`` command line."""
    parser = argparse.ArgumentParser(prog=_program())
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    completion = commands.add_parser(
        "completion",
        help="print the shell completion script: source <(bucketnotify completion bash)",
        description="Print the completion script of the bucketnotify command for bash or zsh."
        " bash: source <(bucketnotify completion bash); zsh: bucketnotify completion zsh >"
        ' "${fpath[1]}/_bucketnotify".',
    )
    completion.add_argument("shell", choices=["bash", "zsh"])
    servers = [
        commands.add_parser(
            "operator", help="reconcile Topics into the gateway (settings: BUCKETNOTIFY_* env)"
        ),
        commands.add_parser(
            "delivery",
            help="serve the ingest and deliver persistent Topics (BUCKETNOTIFY_DELIVERY_* env)",
        ),
    ]
    for server in servers:
        server.add_argument(
            "--log-format",
            choices=["auto", "json", "plain"],
            help="json lines, plain text, or auto: plain on a terminal, else json"
            " (default: $BUCKETNOTIFY_LOG_FORMAT or auto)",
        )
        server.add_argument(
            "--log-level",
            choices=["DEBUG", "INFO", "WARNING", "ERROR"],
            help="default: $BUCKETNOTIFY_LOG_LEVEL or INFO",
        )
    admin.register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command in admin.COMMANDS:
        return admin.run(args)
    if args.command == "completion":
        parser.prog = "bucketnotify"  # the script completes the command, not the plugin
        print(shtab.complete(parser, shell=args.shell))
        return 0
    log_settings = LogSettings()
    logs.configure(args.log_format or log_settings.format, args.log_level or log_settings.level)
    operator = OperatorSettings()
    if operator.gateway_secret_key is not None:
        logs.remember_secrets([operator.gateway_secret_key.get_secret_value()])
    try:
        if args.command == "operator":
            asyncio.run(run_operator(operator))
        elif args.command == "delivery":
            # uvloop's loop costs less per callback and socket operation than asyncio's own
            # (docs/performance-notes.md).
            uvloop.run(run_replica(DeliveryServiceSettings(), operator))
    except ConfigError as exc:
        log.error("cannot connect to the Kubernetes API server: %s", exc)
        return 1
    except ApiError as exc:
        if exc.status not in (401, 403):
            raise
        # In a pod a traceback here only feeds a crash loop; what to fix is the RBAC or the
        # credentials, and the apiserver's own message names the verb and the resource.
        log.error(
            "the API server refused a request (%s %s): %s; check the ServiceAccount's"
            " credentials and RBAC (charts/bucketnotify/templates/rbac.yaml lists what"
            " each part needs)",
            exc.status,
            exc.reason,
            exc.message,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
