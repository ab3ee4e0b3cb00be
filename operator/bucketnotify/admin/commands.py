"""The admin commands, the radosgw-admin ``topic`` commands of a Kubernetes cluster:

    bucketnotify topic list|get|rm|stats|dump
    bucketnotify dead-letters list|show|redrive|purge
    bucketnotify notification list|get
    bucketnotify import rook -f FILE   (offline: Rook's notification objects as ours)

Their arguments, what each does, and the exit code: decided in ``run`` alone, from the kind
of ``AdminError`` (see ``errors``). A command returns what it prints, so nothing reaches the
terminal before it has succeeded or failed as a whole.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from bucketnotify.admin import rook
from bucketnotify.admin.cluster import (
    Cluster,
    Kind,
    QueueAccess,
    dead_letters_of,
    default_namespace,
    move_back,
    open_queues,
    pending,
    queue_stats,
    remove_for_good,
)
from bucketnotify.admin.dead_letters import Chosen, Selection, Stopped, describe, parse_time
from bucketnotify.admin.errors import AdminError, NotFound
from bucketnotify.admin.output import document, table
from bucketnotify.admin.release_check import check_release
from bucketnotify.admin.views import (
    DEAD_LETTER_COLUMNS,
    NOTIFICATION_COLUMNS,
    STATS_COLUMNS,
    TOPIC_COLUMNS,
    clean,
    dead_letter_row,
    dump_entry,
    is_ready,
    notification_row,
    stats_document,
    stats_rows,
    topic_row,
)
from bucketnotify.api.topic import DeliverySettings
from bucketnotify.delivery.model.dead_letters import dead_letter_queue
from bucketnotify.delivery.model.queue import QueueName, QueueStats, ShardStats

__all__ = ["COMMANDS", "EPILOG", "register", "run"]

COMMANDS = ("topic", "dead-letters", "notification", "import", "release")

EPILOG = """\
exit codes:
  0  done
  1  not found, or not possible as asked (a topic that is not persistent, invalid
     settings, an action RBAC forbids)
  2  invalid arguments
  3  the Kubernetes API server or the queue store could not be reached or used

environment:
  KUBECONFIG  the cluster and namespace (else the pod's service account, else
              ~/.kube/config), as kubectl
  BUCKETNOTIFY_DELIVERY_STORE, BUCKETNOTIFY_DELIVERY_LEASE_NAMESPACE,
  BUCKETNOTIFY_DELIVERY_PARTITIONS, BUCKETNOTIFY_GATEWAY_*
              topic stats, topic dump and dead-letters read (and redrive, purge
              write) the queues and Leases of the delivery service: give them the
              delivery service's values
"""

Row = Callable[[dict[str, Any], dt.datetime, bool], list[str]]
COLUMNS: dict[Kind, tuple[list[str], Row]] = {
    "topic": (TOPIC_COLUMNS, topic_row),
    "notification": (NOTIFICATION_COLUMNS, notification_row),
}


@dataclass(frozen=True)
class Done:
    out: str
    """For stdout: the answer."""
    note: str = ""
    """For stderr: a remark beside it (that a list is empty)."""
    code: int = 0
    """The exit code: 1 when part of the answer could not be given (``note`` says why)."""


# --- arguments ------------------------------------------------------------------------------


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {value}")
    return value


def _index(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, not {text}")
    return value


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-n", "--namespace", help="namespace of the object (default: the kubeconfig context's)"
    )
    common.add_argument(
        "--request-timeout",
        type=_seconds,
        default=30.0,
        metavar="SECONDS",
        help="give up on an API server request after this long (default: 30)",
    )
    return common


def _output(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument(
        "-o",
        "--output",
        choices=["table", "json", "yaml"],
        default=default,
        help=f"format (default: {default})",
    )


if TYPE_CHECKING:  # only typeshed's argparse is generic
    Actions = argparse._SubParsersAction[argparse.ArgumentParser]


def _group(commands: Actions, name: str, help: str) -> Actions:
    parser = commands.add_parser(
        name,
        help=help,
        description=help,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return parser.add_subparsers(dest="action", required=True, metavar="ACTION")


def _action(
    actions: Actions, name: str, help: str, common: argparse.ArgumentParser, epilog: str = ""
) -> argparse.ArgumentParser:
    parser = actions.add_parser(
        name,
        parents=[common],
        help=help,
        description=help,
        epilog=epilog + EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return parser


def _list_and_get(actions: Actions, kind: Kind, common: argparse.ArgumentParser) -> None:
    listing = _action(actions, "list", f"list {kind}s (a table, or the objects)", common)
    listing.add_argument("-A", "--all-namespaces", action="store_true", help="in every namespace")
    _output(listing, "table")
    get = _action(actions, "get", f"show one {kind}: spec and status", common)
    get.add_argument("name")
    _output(get, "yaml")


def register(commands: Actions) -> None:
    """Add ``topic``, ``notification`` and ``import`` to the ``bucketnotify`` command's
    subcommands."""
    common = _common()

    topic = _group(commands, "topic", "Topics and the persistent queues of the delivery service")
    _list_and_get(topic, "topic", common)
    rm = _action(
        topic,
        "rm",
        "delete a Topic",
        common,
        epilog="The operator then removes the gateway topic.\n\n",
    )
    rm.add_argument("name")
    stats = _action(
        topic,
        "stats",
        "per shard of a persistent Topic's queue: entries, bytes, open reservations and the "
        "owning delivery replica",
        common,
    )
    stats.add_argument("name")
    _output(stats, "table")
    dump = _action(
        topic,
        "dump",
        "the pending events of a persistent Topic as JSON, shard by shard, oldest first",
        common,
    )
    dump.add_argument("name")
    dump.add_argument(
        "--max-entries",
        type=_count,
        default=1000,
        metavar="N",
        help="at most N events in all (default: 1000)",
    )
    dump.add_argument("--shard", type=_index, metavar="S", help="only shard S")

    _dead_letter_commands(commands, common)

    notification = _group(commands, "notification", "BucketNotifications")
    _list_and_get(notification, "notification", common)

    release = _group(commands, "release", "the installed release as a whole")
    check = _action(
        release,
        "check",
        "does the release work? the operator leads, its webhook answers, a throw-away Topic"
        " becomes Ready and goes (what the chart's helm test runs)",
        common,
        epilog="One line per check, ok or FAIL with what was seen; exit code 1 when one"
        " failed. The throw-away objects are made in --namespace, which the operator must"
        " watch; the Topic uses the operator's default gateway.\n\n",
    )
    check.add_argument(
        "--leader-lease",
        metavar="NAME",
        help="the operator's leader Lease in --namespace (its LEADER_ELECTION_LEASE); unset:"
        " not checked (leader election off)",
    )
    check.add_argument(
        "--lease-namespace",
        metavar="NAMESPACE",
        help="where the leader Lease is (the operator's LEADER_ELECTION_NAMESPACE; default:"
        " --namespace)",
    )
    check.add_argument(
        "--no-webhook", action="store_true", help="the release runs no admission webhook"
    )
    check.add_argument(
        "--no-topic",
        action="store_true",
        help="skip the throw-away Topic (no default gateway: no Topic can become Ready)",
    )
    check.add_argument(
        "--timeout",
        type=_seconds,
        default=120.0,
        metavar="SECONDS",
        help="how long the Topic may take to become Ready (and again to go; default: 120)",
    )

    imports = _group(commands, "import", "our objects for another tool's, printed as YAML")
    from_rook = imports.add_parser(
        "rook",
        help="Topics and BucketNotifications for Rook's CephBucketTopics and"
        " CephBucketNotifications (offline: reads files, not the cluster)",
        description="Print a Topic for each CephBucketTopic and a BucketNotification for each"
        " bucket a CephBucketNotification is bound to (through the labels of the"
        " ObjectBucketClaims in the input). What cannot be converted is named on stderr and"
        " the exit code is 1. Example: kubectl get cephbuckettopics,cephbucketnotifications,obc"
        " -n team-a -o yaml | bucketnotify import rook -f - > bucketnotify.yaml",
    )
    from_rook.add_argument(
        "-f",
        "--filename",
        action="append",
        required=True,
        help="YAML of Rook's objects and the claims they bind ('-' for stdin); repeatable",
    )
    from_rook.add_argument(
        "--gateway-secret",
        metavar="NAME",
        help="gatewayRef of every Topic: a Secret of the object store's user (Rook's"
        " CephObjectStoreUser Secret works as it is); default: the operator's gateway",
    )


# --- the commands ---------------------------------------------------------------------------


def _dead_letter_commands(commands: Actions, common: argparse.ArgumentParser) -> None:
    letters = _group(
        commands,
        "dead-letters",
        "the dead letters a persistent Topic keeps (spec.delivery.deadLetters.keep)",
    )
    selection = argparse.ArgumentParser(add_help=False)
    selection.add_argument("name", help="the Topic")
    selection.add_argument("--prefix", metavar="KEY", help="only objects whose key starts so")
    selection.add_argument(
        "--since",
        metavar="TIME",
        help="only those dropped at or after TIME (RFC 3339, or a duration ago: 30m, 2h)",
    )
    selection.add_argument("--until", metavar="TIME", help="only those dropped before TIME")
    selection.add_argument("--count", type=_count, metavar="N", help="at most N, the oldest first")
    listing = _action(
        letters,
        "list",
        "the dead letters, oldest first: object, event, why and when each was dropped",
        _with(common, selection),
    )
    _output(listing, "table")
    show = _action(
        letters,
        "show",
        "dead letters in full (the event as the gateway sent it)",
        common,
    )
    show.add_argument("name", help="the Topic")
    show.add_argument("id", nargs="+", help="the dead letters' ids (the ID column of list)")
    _output(show, "yaml")
    redrive = _action(
        letters,
        "redrive",
        "move dead letters back into the Topic's queue, to be delivered again",
        _with(common, selection),
        epilog="Each event goes back unchanged (its identity, eventTime and body); its"
        " timeToLive and maxRetries count afresh. A redrive moves: killed at any point and"
        " run again, it loses nothing, and an event already delivered is not pushed again."
        " The replicas pick the events up at their next survey of the queue"
        " (statsIntervalSeconds).\n\n",
    )
    redrive.add_argument(
        "--rate", type=_seconds, metavar="PER_SECOND", help="at most this many events a second"
    )
    purge = _action(
        letters,
        "purge",
        "remove dead letters for good",
        _with(common, selection),
        epilog="Without --prefix, --since, --until or --count it asks for --all.\n\n",
    )
    purge.add_argument("--all", action="store_true", help="every dead letter of the Topic")


def _with(*parents: argparse.ArgumentParser) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(add_help=False, parents=list(parents))


def _namespace(args: argparse.Namespace) -> str:
    return str(args.namespace) if args.namespace else default_namespace()


async def _list(kind: Kind, args: argparse.Namespace) -> Done:
    namespace = None if args.all_namespaces else _namespace(args)
    async with await Cluster.connect(args.request_timeout) as cluster:
        objects = await cluster.list(kind, namespace)
    if args.output != "table":
        return Done(document([clean(o) for o in objects], args.output))
    if not objects:
        where = "any namespace" if namespace is None else f"namespace {namespace}"
        return Done("", f"no {kind}s in {where}\n")
    columns, row = COLUMNS[kind]
    now = dt.datetime.now(dt.UTC)
    everywhere = namespace is None
    head = ["NAMESPACE", *columns] if everywhere else columns
    return Done(table(head, [row(o, now, everywhere) for o in objects]))


async def _get(kind: Kind, args: argparse.Namespace) -> Done:
    namespace = _namespace(args)
    async with await Cluster.connect(args.request_timeout) as cluster:
        obj = await cluster.get(kind, namespace, args.name)
    if args.output == "table":
        columns, row = COLUMNS[kind]
        return Done(table(columns, [row(obj, dt.datetime.now(dt.UTC), False)]))
    return Done(document(clean(obj), args.output))


async def topic_rm(args: argparse.Namespace) -> Done:
    namespace = _namespace(args)
    async with await Cluster.connect(args.request_timeout) as cluster:
        gone = await cluster.delete("topic", namespace, args.name)
    what = f"topic {namespace}/{args.name}"
    if gone:
        return Done(f"{what} deleted\n")
    return Done(f"{what} marked for deletion: the operator removes the gateway topic first\n")


async def _persistent_topic(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    topic = await cluster.get("topic", namespace, name)
    if not (topic.get("spec") or {}).get("persistent"):
        raise AdminError(
            f"topic {namespace}/{name} is not persistent: the gateway pushes its events "
            "itself, so there is no queue"
        )
    return topic


async def topic_stats(args: argparse.Namespace) -> Done:
    namespace = _namespace(args)
    note = ""
    async with open_queues() as queues, await Cluster.connect(args.request_timeout) as cluster:
        topic = await _persistent_topic(cluster, namespace, args.name)
        queue = QueueName(namespace, args.name)
        try:
            stats = await queue_stats(queues.store, queue, time.time())
        except NotFound:
            if not is_ready(topic):
                raise
            # A Ready Topic whose first events have not reached us yet (they may still wait
            # in the gateway's own queue): an empty queue, which is what it is.
            stats = QueueStats({shard: ShardStats(0, 0, 0) for shard in range(_shards(topic))})
            note = NOT_QUEUED_YET.format(queue=queue)
        holders = await cluster.holders(queues.leases)
    found = stats_document(queue, stats, holders, queues.leases)
    if args.output == "table":
        return Done(table(STATS_COLUMNS, stats_rows(found)), note=note)
    return Done(document(found, args.output), note=note)


DEFAULT_SHARDS: int = DeliverySettings.model_fields["shards"].default

NOT_QUEUED_YET = (
    "topic {queue} is Ready and nothing of it is queued yet: the delivery service makes its"
    " queue when it first serves the Topic (if events were sent, check that"
    " BUCKETNOTIFY_DELIVERY_STORE names the delivery service's store)\n"
)


def _shards(topic: dict[str, Any]) -> int:
    return int(((topic.get("spec") or {}).get("delivery") or {}).get("shards", DEFAULT_SHARDS))


async def topic_dump(args: argparse.Namespace) -> Done:
    namespace = _namespace(args)
    async with open_queues() as queues:
        async with await Cluster.connect(args.request_timeout) as cluster:
            topic = await _persistent_topic(cluster, namespace, args.name)
        queue = QueueName(namespace, args.name)
        # The shards the store has: a missing queue is an error here, unless the Topic is
        # Ready and nothing of it was queued yet (an empty dump, as for an empty queue).
        try:
            shards = sorted((await queue_stats(queues.store, queue, time.time())).shards)
        except NotFound:
            if not is_ready(topic):
                raise
            return Done(document([], "json"), note=NOT_QUEUED_YET.format(queue=queue))
        if args.shard is not None:
            if args.shard not in shards:
                raise AdminError(
                    f"topic {queue} has no shard {args.shard}: it has 0 to {shards[-1]}"
                )
            shards = [args.shard]
        found = await pending(queues.store, queue, shards, args.max_entries)
    return Done(document([dump_entry(shard, entry) for shard, entry in found], "json"))


def _selection(args: argparse.Namespace, ids: tuple[str, ...] = ()) -> Selection:
    now = time.time()
    try:
        since = parse_time(args.since, now) if getattr(args, "since", None) else None
        until = parse_time(args.until, now) if getattr(args, "until", None) else None
    except ValueError as exc:
        raise AdminError(f"--since/--until: {exc}") from None
    return Selection(
        prefix=getattr(args, "prefix", None),
        since=since,
        until=until,
        count=getattr(args, "count", None),
        ids=ids,
    )


async def _dead_letters(
    args: argparse.Namespace, queues: QueueAccess, selection: Selection
) -> tuple[QueueName, dict[str, Any], list[Chosen]]:
    namespace = _namespace(args)
    async with await Cluster.connect(args.request_timeout) as cluster:
        # Not only of a persistent Topic: one that stopped being persistent keeps its dead
        # letters, to list and purge (a redrive needs its queue: ``dead_letters_redrive``).
        topic = await cluster.get("topic", namespace, args.name)
    queue = QueueName(namespace, args.name)
    kept = dead_letter_queue(queue)
    try:
        chosen = await dead_letters_of(queues.store, kept, selection)
    except NotFound:
        spec = topic.get("spec") or {}
        keeps = ((spec.get("delivery") or {}).get("deadLetters") or {}).get("keep")
        if keeps:
            return queue, topic, []  # nothing dropped yet since keep was set
        raise AdminError(
            f"topic {queue} keeps no dead letters: set spec.delivery.deadLetters.keep: true"
        ) from None
    return queue, topic, chosen


async def dead_letters_list(args: argparse.Namespace) -> Done:
    async with open_queues() as queues:
        queue, _, chosen = await _dead_letters(args, queues, _selection(args))
    if args.output != "table":
        return Done(document([describe(c) for c in chosen], args.output))
    if not chosen:
        return Done("", f"topic {queue} has no dead letters that match\n")
    return Done(table(DEAD_LETTER_COLUMNS, [dead_letter_row(c) for c in chosen]))


async def dead_letters_show(args: argparse.Namespace) -> Done:
    async with open_queues() as queues:
        queue, _, chosen = await _dead_letters(args, queues, Selection(ids=tuple(args.id)))
    missing = sorted(set(args.id) - {c.entry.id for c in chosen})
    if missing:
        raise NotFound(f"topic {queue} has no dead letter {', '.join(missing)}")
    found = [describe(c) for c in chosen]
    return Done(document(found[0] if len(found) == 1 else found, args.output))


async def dead_letters_redrive(args: argparse.Namespace) -> Done:
    async with open_queues() as queues:
        queue, topic, chosen = await _dead_letters(args, queues, _selection(args))
        if not (topic.get("spec") or {}).get("persistent"):
            raise AdminError(
                f"topic {queue} is not persistent: the gateway pushes its events itself, so"
                " there is no queue to redrive into; set persistent: true first, or purge"
            )
        if not chosen:
            return Done("", f"topic {queue} has no dead letters that match: nothing redriven\n")
        try:
            moved = await move_back(
                queues.store,
                kept=dead_letter_queue(queue),
                into=queue,
                shards=_shards(topic),
                letters=chosen,
                rate=args.rate,
            )
        except Stopped as exc:
            raise AdminError(
                f"redrove {exc.moved} of {len(chosen)} dead letters of topic {queue}, then its"
                f" queue was full ({exc}); run the command again once the queue has room"
            ) from None
    return Done(f"redrove {moved} dead letters into topic {queue}\n")


async def dead_letters_purge(args: argparse.Namespace) -> Done:
    selection = _selection(args)
    if selection.everything and selection.count is None and not args.all:
        raise AdminError(
            "purge removes dead letters for good: say which (--prefix, --since, --until,"
            " --count) or --all"
        )
    async with open_queues() as queues:
        queue, _, chosen = await _dead_letters(args, queues, selection)
        removed = await remove_for_good(queues.store, kept=dead_letter_queue(queue), letters=chosen)
    return Done(f"purged {removed} dead letters of topic {queue}\n")


def _yaml_documents(names: list[str]) -> list[Any]:
    documents: list[Any] = []
    for name in names:
        try:
            text = sys.stdin.read() if name == "-" else Path(name).read_text()
            documents += list(yaml.safe_load_all(text))
        except OSError as exc:
            raise AdminError(f"cannot read {name}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise AdminError(f"{name} is not YAML: {exc}") from None
    return documents


async def release_check(args: argparse.Namespace) -> Done:
    async with await Cluster.connect(args.request_timeout) as cluster:
        checks = await check_release(
            cluster,
            namespace=_namespace(args),
            leader_lease=args.leader_lease,
            lease_namespace=args.lease_namespace,
            webhook=not args.no_webhook,
            topic=not args.no_topic,
            ready_within_s=args.timeout,
        )
    return Done("".join(c.line() for c in checks), "", 0 if all(c.ok for c in checks) else 1)


async def import_rook(args: argparse.Namespace) -> Done:
    done = rook.convert(_yaml_documents(args.filename), args.gateway_secret)
    out = yaml.safe_dump_all(done.objects, sort_keys=False) if done.objects else ""
    note = "".join(f"warning: {problem}\n" for problem in done.problems)
    return Done(out, note, 1 if done.problems else 0)


HANDLERS: dict[tuple[str, str], Callable[[argparse.Namespace], Coroutine[Any, Any, Done]]] = {
    ("topic", "list"): partial(_list, "topic"),
    ("topic", "get"): partial(_get, "topic"),
    ("topic", "rm"): topic_rm,
    ("topic", "stats"): topic_stats,
    ("topic", "dump"): topic_dump,
    ("dead-letters", "list"): dead_letters_list,
    ("dead-letters", "show"): dead_letters_show,
    ("dead-letters", "redrive"): dead_letters_redrive,
    ("dead-letters", "purge"): dead_letters_purge,
    ("notification", "list"): partial(_list, "notification"),
    ("notification", "get"): partial(_get, "notification"),
    ("import", "rook"): import_rook,
    ("release", "check"): release_check,
}


def run(args: argparse.Namespace) -> int:
    """Run the parsed command; its exit code."""
    try:
        done = asyncio.run(HANDLERS[(args.command, args.action)](args))
    except AdminError as exc:
        # One line, whatever a driver's text held: scripts grep it, people read it.
        sys.stderr.write(f"error: {' '.join(str(exc).split())}\n")
        return exc.exit_code
    sys.stderr.write(done.note)
    try:
        sys.stdout.write(done.out)
        sys.stdout.flush()
    except BrokenPipeError:
        # `... | head` read what it wanted: not a failure. The interpreter flushes stdout
        # once more at exit, so point it somewhere that takes the rest.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return done.code
