"""The arrivals endpoint the benchmarks time deliveries with and the demo shows them from:
every record of a POST noted once with its arrival time, a body that is not JSON refused
and counted, and the demo's journal one line per event."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from pathlib import Path

from devstack.programs import free_port, wait_for_port
from devstack.servers.arrivals import Receiver


def _record(key: str, event: str = "ObjectCreated:Put") -> dict[str, object]:
    return {"eventName": event, "s3": {"object": {"key": key, "eTag": f"etag-{key}"}}}


def _post(port: int, body: bytes) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", "/any/path", body, {"Content-Type": "application/json"})
        return conn.getresponse().status
    finally:
        conn.close()


def test_every_record_is_noted_once_with_when_it_arrived() -> None:
    with Receiver() as receiver:
        before = time.time()
        body = json.dumps({"Records": [_record("a"), _record("b", "ObjectRemoved:Delete")]})
        assert _post(receiver.port, body.encode()) == 200
        assert _post(receiver.port, json.dumps({"Records": [_record("c")]}).encode()) == 200
        first = receiver.fetch()
        assert [(a.key, a.etag, a.event) for a in first] == [
            ("a", "etag-a", "ObjectCreated:Put"),
            ("b", "etag-b", "ObjectRemoved:Delete"),
            ("c", "etag-c", "ObjectCreated:Put"),
        ]
        assert all(before <= a.at <= time.time() for a in first)
        assert first[0].at == first[1].at  # one request, one arrival time
        assert receiver.fetch() == []  # each arrival is fetched once

        assert _post(receiver.port, b"not json") == 400
        assert receiver.fetch() == []
        assert receiver.malformed == 1


def test_the_demos_journal_has_a_line_per_event(tmp_path: Path) -> None:
    journal = tmp_path / "received.jsonl"
    port = free_port()
    command = [sys.executable, "-m", "devstack.servers.arrivals", f"--port={port}"]
    server = subprocess.Popen([*command, f"--journal={journal}"])
    try:
        wait_for_port(port, 30)
        records = [_record("x"), _record("y")]
        assert _post(port, json.dumps({"Records": records}).encode()) == 200
        assert _post(port, b"{broken") == 400
        lines = [json.loads(line) for line in journal.read_text().splitlines()]
        assert [line["record"] for line in lines] == records
        assert lines[0]["received_at"] == lines[1]["received_at"]
    finally:
        server.terminate()
        server.wait(10)

    missing = subprocess.run(command, capture_output=True, text=True)
    assert missing.returncode == 2
    assert "--journal" in missing.stderr
