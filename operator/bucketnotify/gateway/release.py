"""Which Ceph release a gateway runs, learned from the gateway itself.

What a Topic may ask of the gateway depends on it: Ceph 18 and later send CloudEvents
headers on the events they push themselves (16.2 sends none), 19 and later refuse topic
names with a dot and page ListTopics. A rule written for one release would be wrong on the
others, so the operator asks the gateway once per endpoint:

- Ceph 20 names its release in every answer's ``Server`` header
  (``Ceph Object Gateway (tentacle)``);
- 16.2 and 18.2 send no such header; an anonymous ``GET /admin/info`` tells them apart:
  18.2 has the resource and refuses the anonymous caller (403), 16.2 does not have it (405).
  Quincy (17) and Squid (19) were not measured: one without a name counts as 18.

A gateway behind a proxy that rewrites these answers is named by the operator's setting
(``BUCKETNOTIFY_GATEWAY_RELEASE``), which wins over anything measured.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Iterable
from dataclasses import dataclass

import httpx

from bucketnotify.gateway.connection import GatewayConnection

__all__ = [
    "EVENTS_SINCE",
    "RELEASES",
    "GatewayRelease",
    "asked_release",
    "detect_release",
    "release_named",
]

RELEASES: dict[str, int] = {
    "pacific": 16,
    "quincy": 17,
    "reef": 18,
    "squid": 19,
    "tentacle": 20,
}
"""Ceph release names and their major versions."""

# The first release that takes an event family in a bucket's notification configuration
# (measured on 16.2, 18.2 and 20.2; 19 not measured, given the benefit: where it refuses, the
# gateway's refusal shows). Ceph 18 and 20 also take "...:Expiration:AbortMultipartUpload",
# but store it as "s3:UnknownEvent": the API does not offer it.
EVENTS_SINCE: tuple[tuple[str, int], ...] = (
    ("s3:ObjectLifecycle:", 18),
    ("s3:ObjectSynced:", 18),
    ("s3:Replication:", 19),
    ("s3:LifecycleExpiration:", 19),
    ("s3:LifecycleTransition", 19),
)

_SERVER = re.compile(r"Ceph Object Gateway \((?P<name>[a-z]+)\)")
_TIMEOUT = httpx.Timeout(10.0)


@dataclass(frozen=True)
class GatewayRelease:
    """A gateway's Ceph release and how it was learned."""

    name: str
    """``pacific``, ``reef``, ``tentacle``... or ``unknown`` when the gateway could not say."""
    learned_from: str
    """``server-header``, ``admin-info``, ``setting`` or ``unreachable``."""

    @property
    def major(self) -> int | None:
        return RELEASES.get(self.name)

    @property
    def sends_cloud_events(self) -> bool:
        """Whether the gateway's own push carries ``ce-*`` headers (18 and later). An
        unknown release is given the benefit: the Topic's events show it at once."""
        return self.major is None or self.major >= 18

    @property
    def aborts_on_amqp_confirms(self) -> bool:
        """Whether the gateway's own AMQP push that waits for the broker's confirm
        (``amqp-ack-level`` broker or routable) can abort the whole radosgw process: Ceph
        18.2.7 does on a CompleteMultipartUpload of a notified bucket (glibc's mutex
        assertion in its ``amqp_manager`` thread; ack-level none, 16.2 and 20.2 did not).
        17 and 19 were not measured and are named ``reef`` when they do not say (set the
        release to say otherwise); an unknown release is given the benefit."""
        return self.name == "reef"

    @property
    def makes_topic_copies(self) -> bool:
        """Whether each notification gets a topic copy ``<id>_<topic>`` (before 19's
        notification_v2 format); unknown: yes, so that copies a DELETE left are removed."""
        return self.major is None or self.major < 19

    @property
    def refuses_dotted_topic_names(self) -> bool:
        """Whether CreateTopic takes only AWS's characters (19 and later)."""
        return self.major is not None and self.major >= 19

    @property
    def queues_act_on_limits(self) -> bool:
        """Whether the gateway may expire the entries of its persistent queues by the
        topic's ``time_to_live`` and ``max_retries``: 20 does, 18 stores them unused; 19
        was not measured and counts as acting (sending the values where they are ignored
        does no harm, leaving them out where they act could lose events)."""
        return self.major is not None and self.major >= 19

    def refused_events(self, events: Iterable[str]) -> list[str]:
        """The events of ``events`` this release does not take (in their order); none for
        a release not known, the gateway then says."""
        major = self.major
        if major is None:
            return []
        return [
            event
            for event in events
            if major < next((since for p, since in EVENTS_SINCE if event.startswith(p)), 0)
        ]

    def __str__(self) -> str:
        return self.name


def release_named(name: str) -> GatewayRelease:
    """The release a setting names; ValueError with the names it takes otherwise."""
    if name.lower() not in RELEASES:
        raise ValueError(f"unknown Ceph release {name!r}: use one of {', '.join(RELEASES)}")
    return GatewayRelease(name.lower(), "setting")


def detect_release(endpoint: str, verify: ssl.SSLContext | bool = True) -> GatewayRelease:
    """Ask the gateway at ``endpoint`` (two anonymous GETs at most, no credentials sent)."""
    try:
        with httpx.Client(base_url=endpoint, verify=verify, timeout=_TIMEOUT) as client:
            named = _SERVER.search(client.get("/").headers.get("server", ""))
            if named and named.group("name") in RELEASES:
                return GatewayRelease(named.group("name"), "server-header")
            info = client.get("/admin/info")
    except httpx.HTTPError:
        return GatewayRelease("unknown", "unreachable")
    if info.status_code == 405:
        return GatewayRelease("pacific", "admin-info")
    return GatewayRelease("reef", "admin-info")


def asked_release(connection: GatewayConnection) -> GatewayRelease:
    """``detect_release`` of the gateway at ``connection``, trusting what it trusts (its CA
    bundle over HTTPS). Blocking: call it from a worker thread in async code."""
    endpoint = connection.endpoint
    verify = connection.ssl_context() if endpoint.startswith("https://") else True
    return detect_release(endpoint, verify)
