"""``make demo`` run again stops the demo that runs first; ``make demo-down`` stops the
demo's processes and the local services. Real processes and real scripts, in a state
directory and a services directory of the test's own (the shared services are never
touched)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import demo.__main__ as demo_main
import pytest
from demo import processes

ROOT = Path(__file__).resolve().parents[2]


class Stopped(Exception):
    """Where the test ends ``up``: after it dealt with the running demo."""


@pytest.fixture()
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    state_dir = tmp_path / "demo"
    monkeypatch.setattr(processes, "STATE_DIR", state_dir)
    monkeypatch.setattr(processes, "STATE", state_dir / "state.json")
    monkeypatch.setattr(demo_main, "STATE", state_dir / "state.json")
    # The demo's AMQP queue lives on the shared RabbitMQ: not this test's to delete.
    monkeypatch.setattr(demo_main, "_delete_amqp_queue", lambda: None)
    state_dir.mkdir()
    return state_dir


def test_a_second_up_stops_the_running_demo_first(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    running = processes.State()
    replica = running.spawn("delivery-1", ["sleep", "300"], {})
    assert processes.alive(replica["pid"])

    def services_next(name: str) -> None:
        raise Stopped(name)

    monkeypatch.setattr(demo_main, "_service", services_next)
    with pytest.raises(Stopped):
        demo_main.up()
    assert not processes.alive(replica["pid"]), "the running demo's process was not stopped"
    fresh = processes.State.load()
    assert fresh is not None and fresh.processes == [], "the new demo starts from nothing"


def test_down_stops_the_processes_and_then_the_services(
    state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scripts = tmp_path / "local"
    scripts.mkdir()
    calls = tmp_path / "calls"
    for name in ("kube", "ceph", "rabbitmq", "kafka"):
        (scripts / f"{name}.sh").write_text(f'echo "{name} $*" >> {calls}\n')
    monkeypatch.setattr(demo_main, "LOCAL", scripts)
    replica = processes.State().spawn("delivery-1", ["sleep", "300"], {})

    demo_main.down(stop_services=False)  # `down --keep-services`, as the e2e test runs it
    assert not processes.alive(replica["pid"])
    assert not calls.exists()
    assert processes.State.load() is None

    demo_main.down()
    stopped = calls.read_text().splitlines()
    assert stopped == ["kafka stop", "rabbitmq stop", "ceph stop", "kube stop"]

    shown = subprocess.run(
        ["make", "-n", "demo-down"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    (command,) = [line for line in shown.stdout.splitlines() if "-m demo" in line]
    assert command.endswith("-m demo down"), "make demo-down keeps the services"
