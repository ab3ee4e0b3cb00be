"""The test gateway as an administrator reads it: radosgw's request counter and its topics."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from bench.kube import SetupError
from devstack.gateway import ceph_tool, listed_topic_names
from devstack.services import Service

__all__ = ["Gateway"]


class Gateway:
    """The shared gateway's counters and topic list, read the way an administrator would."""

    def __init__(self, rgw: Service) -> None:
        self.rgw = rgw
        self.conf = rgw["CEPH_CONF"]
        self.asok = str(Path(self.conf).parent / "client.rgw.local.asok")

    def requests(self) -> int | None:
        """Requests radosgw served since it started (all clients), None when unreadable."""
        result = subprocess.run(
            ceph_tool(self.rgw, "ceph", "--admin-daemon", self.asok, "perf", "dump"),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if result.returncode != 0:
            return None
        value: int = json.loads(result.stdout)["rgw"]["req"]
        return value

    def topic_names(self, *marks: str) -> list[str]:
        """Names of gateway topics (notification copies included) containing any mark."""
        result = subprocess.run(
            ceph_tool(self.rgw, "radosgw-admin", "topic", "list"),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if result.returncode != 0 and "(2) No such file" in result.stderr:
            return []  # a tenant that never had a topic has no topics object yet
        if result.returncode != 0:
            raise SetupError(f"radosgw-admin topic list failed: {result.stderr.strip()}")
        names = listed_topic_names(result.stdout)
        return sorted(n for n in names if any(m in n for m in marks))

    def remove(self, names: list[str]) -> None:
        for name in names:
            subprocess.run(
                ceph_tool(self.rgw, "radosgw-admin", "topic", "rm", f"--topic={name}"),
                capture_output=True,
                timeout=120,
                check=False,
            )


# --- process figures ------------------------------------------------------------------------
