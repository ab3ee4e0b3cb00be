"""Our own programs as real subprocesses, with their logs kept for failing tests."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from pathlib import Path

from tests.localservices import REPO

BIN = REPO / ".venv" / "bin"
# What getpass.getuser() reads before it asks the user database.
USER_NAME_VARIABLES = ("LOGNAME", "USER", "LNAME", "USERNAME")


class Program:
    """A running ``bucketnotify`` command; its combined output goes to a log file."""

    def __init__(self, args: list[str], env: dict[str, str], user: int | None = None) -> None:
        """``user``: seen by the process as its numeric uid and gid, with no passwd entry
        and none of the variables that name a user, as in our image. A user namespace maps
        it onto ours, so it still reads what we can (our Python lives under /root)."""
        self.log_path = Path(tempfile.mkstemp(prefix="bucketnotify-", suffix=".log")[1])
        self._log = self.log_path.open("w")
        environ = {**os.environ, **env}
        command = [str(BIN / "bucketnotify"), *args]
        if user is not None:
            for name in USER_NAME_VARIABLES:
                environ.pop(name, None)
            command = ["unshare", "--user", f"--map-user={user}", f"--map-group={user}", *command]
        self.process = subprocess.Popen(
            command,
            env=environ,
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
