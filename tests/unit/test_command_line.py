"""The installed command as a user meets it: its version, its shell completion, and its name
as a kubectl plugin. Run as the executables pip installed, not as functions."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from prometheus_client import generate_latest

from bucketnotify.metrics import DeliveryMetrics, OperatorMetrics
from bucketnotify.settings import LogSettings

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


def started_without_a_cluster(
    command: str, *flags: str, env: dict[str, str] | None = None, terminal: bool = False
) -> str:
    """What ``bucketnotify <command>`` writes to stderr when there is no cluster to reach
    (no kubeconfig, not in a pod): its logging set up, one ERROR line, exit status 1."""
    home = Path(os.environ.get("TMPDIR", "/tmp")) / f"bn-no-cluster-{os.getpid()}"
    clean = {"PATH": os.environ["PATH"], "HOME": str(home), **(env or {})}
    clean["BUCKETNOTIFY_DELIVERY_STORE"] = f"dir://{home}/queues"
    args = [str(BIN / "bucketnotify"), command, *flags]
    if not terminal:
        done = subprocess.run(args, capture_output=True, text=True, timeout=60, env=clean)
        assert done.returncode == 1, done.stderr
        return done.stderr
    leader, follower = pty.openpty()
    try:
        process = subprocess.run(
            args, stderr=follower, stdout=subprocess.DEVNULL, timeout=60, env=clean
        )
        assert process.returncode == 1
        return os.read(leader, 65536).decode()
    finally:
        os.close(leader)
        os.close(follower)


def test_log_format_is_chosen_by_the_flag_over_the_variable_and_auto_by_the_terminal() -> None:
    for command in ("operator", "delivery"):
        (line,) = started_without_a_cluster(command, "--log-format", "json").splitlines()
        assert json.loads(line)["severity"] == "error"
        plain = started_without_a_cluster(
            command, "--log-format", "plain", env={"BUCKETNOTIFY_LOG_FORMAT": "json"}
        )
        assert re.fullmatch(r"\S+ \S+ ERROR bucketnotify: cannot connect to .*\n", plain)
    # auto: JSON into a pipe (a pod's log), plain on a terminal (a person).
    assert json.loads(started_without_a_cluster("operator"))["severity"] == "error"
    on_terminal = started_without_a_cluster("operator", terminal=True)
    assert " ERROR bucketnotify: cannot connect to " in on_terminal
    assert not on_terminal.startswith("{")


def test_log_level_is_chosen_by_the_flag_over_the_variable_and_is_info_by_default() -> None:
    debug = ("--log-format", "plain", "--log-level", "DEBUG")
    # asyncio's first line is at DEBUG: it shows whether DEBUG lines are written.
    assert " DEBUG asyncio: " in started_without_a_cluster("operator", *debug)
    quiet = started_without_a_cluster(
        "operator",
        "--log-format",
        "plain",
        "--log-level",
        "ERROR",
        env={"BUCKETNOTIFY_LOG_LEVEL": "DEBUG"},
    )
    assert " DEBUG " not in quiet and " ERROR " in quiet
    by_variable = started_without_a_cluster(
        "operator", "--log-format", "plain", env={"BUCKETNOTIFY_LOG_LEVEL": "DEBUG"}
    )
    assert " DEBUG asyncio: " in by_variable
    default = started_without_a_cluster("delivery", "--log-format", "plain")
    assert " DEBUG " not in default and " ERROR " in default
    assert LogSettings.model_fields["level"].default == "INFO"
