"""The installed command as a user meets it: its version, its shell completion, and its name
as a kubectl plugin. Run as the executables pip installed, not as functions."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

from prometheus_client import generate_latest

from bucketnotify.metrics import DeliveryMetrics, OperatorMetrics

BIN = Path(sys.executable).parent
VERSION = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"][
    "version"
]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(args, capture_output=True, text=True, timeout=60, env=env, check=True)


def test_version_is_the_one_of_pyproject() -> None:
    assert run(str(BIN / "bucketnotify"), "--version").stdout == f"bucketnotify {VERSION}\n"


def test_as_a_kubectl_plugin_its_usage_says_kubectl_bucketnotify() -> None:
    """kubectl runs ``kubectl-bucketnotify`` for ``kubectl bucketnotify``."""
    plugin = str(BIN / "kubectl-bucketnotify")
    assert run(plugin, "--version").stdout == f"kubectl bucketnotify {VERSION}\n"
    assert run(plugin, "topic", "--help").stdout.startswith("usage: kubectl bucketnotify topic")


def test_bash_completion_offers_the_commands_and_their_actions() -> None:
    completed = run(
        "bash",
        "-c",
        "source <(bucketnotify completion bash)\n"
        'COMP_WORDS=(bucketnotify to); COMP_CWORD=1; _shtab_bucketnotify; echo "${COMPREPLY[@]}"\n'
        'COMP_WORDS=(bucketnotify topic ""); COMP_CWORD=2; _shtab_bucketnotify;'
        ' echo "${COMPREPLY[@]}"',
    )
    first, second = completed.stdout.splitlines()
    assert first == "topic"
    assert set(second.split()) == {"list", "get", "rm", "stats", "dump"}


def test_zsh_completion_names_the_command() -> None:
    script = run("bucketnotify", "completion", "zsh").stdout
    assert script.startswith("#compdef bucketnotify")


def test_both_processes_expose_their_build() -> None:
    for metrics in (DeliveryMetrics(), OperatorMetrics()):
        exposed = generate_latest(metrics.registry).decode()
        python = ".".join(map(str, sys.version_info[:3]))
        assert f'bucketnotify_build_info{{python="{python}",version="{VERSION}"}} 1.0' in exposed
