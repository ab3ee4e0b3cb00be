"""Our own commands as real subprocesses, with their logs kept beside the results."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from bench.services import REPO

__all__ = ["Program", "ProgramDied", "cpu_seconds", "free_port", "wait_for_port"]

BIN = REPO / ".venv" / "bin"
_TICKS = os.sysconf("SC_CLK_TCK")


class ProgramDied(RuntimeError):
    """One of our subprocesses exited while the benchmark needed it."""


class Program:
    """A running ``bucketnotify`` command; its combined output goes to ``log_path``."""

    def __init__(
        self,
        name: str,
        args: list[str],
        env: dict[str, str],
        log_dir: Path,
        *,
        profile: bool = False,
    ) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self.profile_path = log_dir / f"{name}.prof" if profile else None
        executable = BIN / "bucketnotify"
        if not executable.exists():
            raise ProgramDied(f"{executable} does not exist: run `make install` first")
        command = [str(executable), *args]
        if self.profile_path is not None:
            # cProfile writes its file when the command returns, which SIGTERM makes it do.
            command = [str(BIN / "python"), "-m", "cProfile", "-o", str(self.profile_path)]
            command += [str(executable), *args]
        self._log = self.log_path.open("w")
        self.process = subprocess.Popen(
            command,
            env={**os.environ, **env},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            # Its own session: a Ctrl-C in the terminal reaches only the benchmark, which then
            # stops its programs in order instead of having them die halfway through a round.
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def check_alive(self) -> None:
        code = self.process.poll()
        if code is not None:
            raise ProgramDied(
                f"{self.name} exited with {code}; its log ({self.log_path}) ends:\n{self.tail()}"
            )

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU time of a live process (Linux /proc), None when it is gone."""
    if pid is None:
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces; the fields after it are fixed.
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_for_port(port: int, timeout: float, program: Program | None = None) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            pass
        if program is not None:
            program.check_alive()
        if time.monotonic() > deadline:
            raise ProgramDied(f"nothing listens on 127.0.0.1:{port} after {timeout:.0f} s")
        time.sleep(0.1)
