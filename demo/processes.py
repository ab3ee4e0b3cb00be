"""The demo's own processes: started in sessions of their own so they outlive ``up``, and
recorded in ``$BN_RUN/demo/state.json`` so ``down`` and ``status`` find them by pid."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from demo.console import DemoError, info
from devstack.programs import wait_for_port
from devstack.services import REPO, RUN_DIR

STATE_DIR = RUN_DIR / "demo"
STATE = STATE_DIR / "state.json"


class State:
    """What ``up`` started, saved after each start so a failed ``up`` can still be stopped."""

    def __init__(self, data: dict[str, Any] | None = None) -> None:
        self.data: dict[str, Any] = data or {"processes": []}

    @classmethod
    def load(cls) -> State | None:
        return cls(json.loads(STATE.read_text())) if STATE.exists() else None

    @property
    def processes(self) -> list[dict[str, Any]]:
        procs: list[dict[str, Any]] = self.data["processes"]
        return procs

    def save(self) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        STATE.write_text(json.dumps(self.data, indent=2))

    def spawn(
        self, name: str, command: list[str], env: dict[str, str], port: int | None = None
    ) -> dict[str, Any]:
        log = STATE_DIR / f"{name}.log"
        with log.open("w") as out:
            process = subprocess.Popen(
                command,
                env={**os.environ, **env},
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                start_new_session=True,
            )
        proc = {"name": name, "pid": process.pid, "log": str(log), "port": port}
        self.processes.append(proc)
        self.save()
        return proc


def alive(pid: int) -> bool:
    # Our children become zombies until reaped; a zombie is not alive for anyone here.
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_listening(proc: dict[str, Any], timeout: float = 90) -> None:
    try:
        wait_for_port(proc["port"], timeout)
    except Exception as exc:
        raise DemoError(
            f"{proc['name']} does not listen on {proc['port']}; see {proc['log']}"
        ) from exc
    if not alive(proc["pid"]):
        raise DemoError(f"{proc['name']} exited; see {proc['log']}")


def stop(proc: dict[str, Any], grace: float = 20) -> None:
    """SIGTERM, then SIGKILL after ``grace`` s: a delivery replica first hands back its
    Leases and writes its last delivery records."""
    pid = proc["pid"]
    if not alive(pid):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if alive(pid):
        os.kill(pid, signal.SIGKILL)
        info(f"{proc['name']} did not stop within {grace:.0f} s: killed")
    else:
        info(f"{proc['name']} stopped")


def log_tail(proc: dict[str, Any], lines: int = 15) -> str:
    try:
        text = Path(proc["log"]).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
