"""The Spark report on many records: wall time and peak memory of one run of the job.

    python -m bench.report --records 10000000

Generates a day of delivery records (gzip JSON lines in the delivery service's layout, 5,000
per file like its default batch) once and keeps them under ``~/.cache/bucketnotify/bench``,
then runs ``python -m bucketnotify_report`` on them with local[*] and prints how long it took
and the peak resident memory of the job's whole process tree (Python driver and JVM).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tests.recordfiles import LocalFiles, batch_key, encode

from bucketnotify.records import FIELDS, DeliveryRecord, Outcome
from devstack.services import REPO

DAY_START = 1_763_596_800.0  # 2025-11-20T00:00:00Z
DAY = "2025-11-20"
BATCH = 5000
TOPICS = [(f"team-{n % 3}", f"topic-{n:02d}") for n in range(12)]
EVENTS = ("ObjectCreated:Put", "ObjectCreated:Put", "ObjectCreated:Copy", "ObjectRemoved:Delete")


def _records_of_event(rng: random.Random, index: int) -> list[DeliveryRecord]:
    """One event's life: ingested, some failed attempts, then delivered or expired, with the
    occasional failover duplicate and suppressed gateway re-send."""
    namespace, topic = TOPICS[index % len(TOPICS)]
    # Busy afternoons, quiet nights; topic-03 is slow, topic-07 fails a lot.
    hour = min(23, max(0, int(rng.gauss(14, 5))))
    event_time = DAY_START + hour * 3600 + rng.random() * 3599
    ingest = event_time + rng.expovariate(20)
    slow = 8.0 if topic == "topic-03" else 1.0
    fail_rate = 0.35 if topic == "topic-07" else 0.03
    base: dict[str, Any] = {
        "namespace": namespace,
        "topic": topic,
        "bucket": f"bucket-{index % 40}",
        "key": f"objects/{index}",
        "event_name": EVENTS[index % len(EVENTS)],
        "configuration_id": "notif",
        "event_id": f"ev-{index}",
        "event_time": event_time,
        "ingest_time": ingest,
        "shard": index % 11,
        "replica": f"delivery-{index % 3}",
    }
    last = DAY_START + 86399.0

    def record(outcome: Outcome, at: float, attempts: int, error: str | None = None) -> None:
        kind = None if outcome is Outcome.INGESTED else "http"
        out.append(
            DeliveryRecord(
                outcome=outcome,
                outcome_time=min(at, last),
                attempts=attempts,
                endpoint_kind=kind,
                error=error,
                **base,
            )
        )

    out: list[DeliveryRecord] = []
    record(Outcome.INGESTED, ingest, 0)
    now, attempt = ingest, 1
    while rng.random() < fail_rate and attempt <= 5:
        now += rng.expovariate(1 / (0.05 * slow)) + 2.0
        record(Outcome.FAILED, now, attempt, "HTTP 503")
        attempt += 1
    end = now + rng.expovariate(1 / (0.05 * slow))
    final = Outcome.EXPIRED if attempt > 5 else Outcome.DELIVERED
    record(final, end, attempt)
    if final is Outcome.DELIVERED and rng.random() < 0.002:
        record(Outcome.DELIVERED, end + 5, 1)  # a failover delivered it twice
    if rng.random() < 0.01:
        record(Outcome.DUPLICATE, end + 1, attempt)  # a gateway re-send, suppressed
    return out


def _encode(records: list[DeliveryRecord]) -> bytes:
    # DeliveryRecord.to_json's dataclasses.asdict deep-copies each record: three times
    # slower than this, which writes the same JSON object for the fields of the schema.
    return encode(
        json.dumps({f.name: getattr(r, f.name) for f in FIELDS}, separators=(",", ":"))
        for r in records
    )


def _write_share(args: tuple[Path, int, int, int]) -> int:
    root, worker, workers, records = args
    rng = random.Random(worker)  # noqa: S311 - synthetic data, reproducible per worker
    files = LocalFiles(root)
    by_hour: dict[int, list[DeliveryRecord]] = {}
    written, index, millis = 0, worker, 0
    while written < records:
        for record in _records_of_event(rng, index):
            hour = int((record.outcome_time - DAY_START) // 3600)
            pending = by_hour.setdefault(hour, [])
            pending.append(record)
            written += 1
            if len(pending) == BATCH:
                millis += 1
                files.put(batch_key(pending, f"w{worker}", millis), _encode(pending))
                pending.clear()
        index += workers
    for pending in by_hour.values():
        if pending:
            millis += 1
            files.put(batch_key(pending, f"w{worker}", millis), _encode(pending))
    return written


def generate(root: Path, records: int) -> int:
    marker = root / "complete.json"
    if marker.exists():
        return int(json.loads(marker.read_text())["records"])
    workers = os.cpu_count() or 1
    share = -(-records // workers)
    with multiprocessing.Pool(workers) as pool:
        written = sum(pool.map(_write_share, [(root, w, workers, share) for w in range(workers)]))
    marker.write_text(json.dumps({"records": written}))
    return written


def _tree_rss(root_pid: int) -> int:
    """Resident bytes of ``root_pid`` and all its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            status = (entry / "status").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                rss[int(entry.name)] = int(line.split()[1]) * 1024
    total, stack = 0, [root_pid]
    while stack:
        pid = stack.pop()
        total += rss.get(pid, 0)
        stack.extend(children.get(pid, []))
    return total


def run_job(records: Path, out: Path) -> tuple[float, int, str]:
    command = [sys.executable, "-m", "bucketnotify_report", "--input", str(records)]
    command += ["--output", str(out), "--date", DAY]
    log = Path(tempfile.mkstemp(prefix="bench-report-", suffix=".log")[1])
    started = time.monotonic()
    with log.open("w") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, cwd=REPO)
        peak = 0
        done = threading.Event()

        def watch() -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, _tree_rss(process.pid))
                done.wait(0.5)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        code = process.wait()
        elapsed = time.monotonic() - started
        done.set()
        watcher.join()
    if code != 0:
        raise SystemExit(f"the job failed ({code}); its log: {log}")
    return elapsed, peak, str(log)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.report")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument(
        "--data",
        type=Path,
        default=Path.home() / ".cache" / "bucketnotify" / "bench",
        help="where generated records are kept between runs",
    )
    args = parser.parse_args()
    root = args.data / f"records-{args.records}"
    started = time.monotonic()
    written = generate(root, args.records)
    generated = time.monotonic() - started
    files = list(root.rglob("*.jsonl.gz"))
    size = sum(f.stat().st_size for f in files)
    with tempfile.TemporaryDirectory(prefix="bench-report-") as out:
        elapsed, peak, log = run_job(root, Path(out))
        summary = json.loads((Path(out) / "summary" / f"{DAY}.json").read_text())
    load = os.getloadavg()
    result = {
        "records": written,
        "files": len(files),
        "input_mib": round(size / 2**20, 1),
        "generate_s": round(generated, 1),
        "job_s": round(elapsed, 1),
        "records_per_s": round(written / elapsed),
        "peak_rss_mib": round(peak / 2**20),
        "load_average": [round(x, 2) for x in load],
        "cpus": os.cpu_count(),
        "triggered": summary["totals"]["triggered"],
        "delivered": summary["totals"]["delivered"],
        "log": log,
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
