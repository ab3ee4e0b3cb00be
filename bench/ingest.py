"""The ingest path alone: concurrent POSTs to the ingest, committed to a local-dir store.

``python -m bench.ingest [--requests N] [--clients C] [--records R] [--shards S]``. No
gateway, no endpoint, no Kubernetes: one process runs the ingest server (as the delivery
service does) and C client loops POSTing R records each until N requests are answered.
So the figures are what our ingest, group commit and store cost, apart from everything
else on a shared machine. Prints requests/s, latency percentiles, CPU milliseconds per
request (all threads of the process, clients included) and how many batch files the
requests became (fewer than requests: group commit at work).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from tests.records import event

from bucketnotify.delivery.ingest.handler import Ingest
from bucketnotify.delivery.model.queue import QueueLimits, QueueName
from bucketnotify.delivery.service import build_app
from bucketnotify.delivery.stores.localdir import LocalDirStore
from bucketnotify.delivery.topics.ingest_tokens import IngestTopic

QUEUE = QueueName("bench", "ingest")
TOKEN = "bench-token"  # noqa: S105 - the ingest token of a throwaway queue


def record(n: int) -> dict[str, Any]:
    """The n-th event of the run: a key of its own, the rest as the gateway sends it."""
    return event(
        f"key-{n}",
        bucket="bench",
        sequencer="01",
        request_id=f"req-{n}",
        configuration_id="bench",
    )


def batch_files(root: Path) -> int:
    return sum(len(os.listdir(d)) for d in root.glob(f"{QUEUE}/shard-*"))


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as root:
        store = LocalDirStore(Path(root))
        await store.create(QUEUE, args.shards, QueueLimits())
        topics = {(QUEUE.namespace, QUEUE.topic): IngestTopic(QUEUE, TOKEN, args.shards)}
        runner = web.AppRunner(build_app(Ingest(store, topics)), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        url = f"http://127.0.0.1:{port}/v1/topics/{QUEUE.namespace}/{QUEUE.topic}/{TOKEN}"
        latencies: list[float] = []
        numbers = iter(range(args.requests))
        async with aiohttp.ClientSession() as session:

            async def client() -> None:
                for n in numbers:
                    body = {"Records": [record(n * args.records + r) for r in range(args.records)]}
                    started = time.perf_counter()
                    async with session.post(url, json=body) as response:
                        if response.status != 200:
                            raise RuntimeError(f"ingest answered {response.status}")
                    latencies.append(time.perf_counter() - started)

            wall, cpu = time.perf_counter(), time.process_time()
            await asyncio.gather(*(client() for _ in range(args.clients)))
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        await runner.cleanup()
        files = batch_files(Path(root))
    latencies.sort()

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(len(latencies) * p))] * 1000

    load = os.getloadavg()[0]
    print(
        f"ingest: {args.requests} requests x {args.records} records, {args.clients} clients, "
        f"{args.shards} shards; load average {load:.1f}\n"
        f"  {args.requests / wall:.0f} requests/s, p50 {pct(0.5):.1f} ms, p99 {pct(0.99):.1f} ms,"
        f" {cpu / args.requests * 1000:.2f} CPU ms/request, {files} batch files"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.ingest",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--requests", type=int, default=2000, help="requests in all")
    parser.add_argument("--clients", type=int, default=8, help="concurrent client loops")
    parser.add_argument("--records", type=int, default=1, help="records per request")
    parser.add_argument("--shards", type=int, default=11, help="queue shards (Topic default)")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
