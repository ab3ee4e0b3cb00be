"""Our own programs as real subprocesses, with their logs kept for failing tests."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from pathlib import Path

from tests.localservices import REPO

BIN = REPO / ".venv" / "bin"


class Program:
    """A running ``bucketnotify`` command; its combined output goes to a log file."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.log_path = Path(tempfile.mkstemp(prefix="bucketnotify-", suffix=".log")[1])
        self._log = self.log_path.open("w")
        self.process = subprocess.Popen(
            [str(BIN / "bucketnotify"), *args],
            env={**os.environ, **env},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
