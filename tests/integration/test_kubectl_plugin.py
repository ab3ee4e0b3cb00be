"""``kubectl bucketnotify``: kubectl's own plugin discovery finds the installed command, and
its completion of plugins asks ``kubectl_complete-bucketnotify`` (kubectl 1.26+)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.localservices import LocalService

BIN = Path(sys.executable).parent


def kubectl(kube: LocalService, *args: str) -> subprocess.CompletedProcess[str]:
    # Only the project's executables added to PATH, as a user's pip install puts them there.
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(
        [kube["KUBECTL"], *args], capture_output=True, text=True, timeout=60, env=env, check=True
    )


def test_kubectl_finds_the_plugin_and_runs_it(kube: LocalService) -> None:
    listed = kubectl(kube, "plugin", "list").stdout
    assert str(BIN / "kubectl-bucketnotify") in listed, listed
    usage = kubectl(kube, "bucketnotify", "topic", "--help").stdout
    assert usage.startswith("usage: kubectl bucketnotify topic"), usage


def test_kubectl_completes_the_plugins_commands_and_values(kube: LocalService) -> None:
    """What ``kubectl bucketnotify <TAB>`` offers: kubectl's hidden ``__complete`` is the
    request its shell completion scripts send."""
    actions = kubectl(kube, "__complete", "bucketnotify", "topic", "").stdout.splitlines()
    assert actions[-1] == ":4"  # no file names
    assert {"list", "get", "rm", "stats", "dump"} <= set(actions[:-1])
    shells = kubectl(kube, "__complete", "bucketnotify", "completion", "z").stdout.splitlines()
    assert shells == ["zsh", ":4"]
