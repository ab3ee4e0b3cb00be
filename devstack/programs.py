"""Our own ``bucketnotify`` commands as real subprocesses, each with a log file of its own."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["BIN", "Program", "ProgramDied", "cpu_seconds", "free_port", "wait_for_port"]

BIN = Path(sys.executable).parent
"""The venv of the Python running this: the project's commands are installed beside it
(``.venv/bin`` on the host, the Python 3.13 root's own venv in the compatibility tier)."""
# What getpass.getuser() reads before it asks the user database.
USER_NAME_VARIABLES = ("LOGNAME", "USER", "LNAME", "USERNAME")
_TICKS = os.sysconf("SC_CLK_TCK")


class ProgramDied(RuntimeError):
    """One of our subprocesses is missing or exited while it was needed."""


class Program:
    """A running ``bucketnotify <args>``; its combined output goes to ``log_path``."""

    def __init__(
        self,
        args: list[str],
        env: dict[str, str],
        *,
        name: str = "bucketnotify",
        log_dir: Path | None = None,
        profile: bool = False,
        user: int | None = None,
    ) -> None:
        """``env`` is added to ours. ``log_dir``: the log is ``<log_dir>/<name>.log`` (a
        file of its own in the temporary directory without one). ``profile``: run under
        cProfile, which writes ``<name>.prof`` beside the log when the command returns (as
        SIGTERM makes it do). ``user``: seen by the process as its numeric uid and gid,
        with no passwd entry and none of the variables that name a user, as in our image;
        a user namespace maps it onto ours, so it still reads what we can."""
        self.name = name
        if log_dir is None:
            fd, path = tempfile.mkstemp(prefix=f"{name}-", suffix=".log")
            os.close(fd)
            self.log_path = Path(path)
        else:
            self.log_path = log_dir / f"{name}.log"
        self.profile_path = self.log_path.with_suffix(".prof") if profile else None
        executable = BIN / "bucketnotify"
        if not executable.exists():
            raise ProgramDied(f"{executable} does not exist: run `make install` first")
        command = [str(executable), *args]
        if self.profile_path is not None:
            command = [str(BIN / "python"), "-m", "cProfile", "-o", str(self.profile_path)]
            command += [str(executable), *args]
        environ = {**os.environ, **env}
        if user is not None:
            for variable in USER_NAME_VARIABLES:
                environ.pop(variable, None)
            command = ["unshare", "--user", f"--map-user={user}", f"--map-group={user}", *command]
        self._log = self.log_path.open("w")
        self.process = subprocess.Popen(
            command,
            env=environ,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            # Its own session: a Ctrl-C in the terminal reaches only the caller, which then
            # stops its programs in order instead of having them die halfway through.
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

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


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on (as of now)."""
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def wait_for_port(port: int, timeout: float, program: Program | None = None) -> None:
    """Until something accepts connections on 127.0.0.1:``port``; ``ProgramDied`` when
    ``program`` exits first or nothing does within ``timeout`` seconds."""
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
