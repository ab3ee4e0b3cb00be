"""Huawei OBS's dialect of the bucket notification configuration (``PUT /?notification``).

Where it differs from the S3/Ceph document ``notifications`` renders:

- the topic is an SMN topic URN, ``urn:smn:<region>:<project id>:<topic>``; OBS has no SNS
  API, so a notification can only name an existing SMN topic (``topicARN``), never a Topic
  of ours;
- event names have no ``s3:`` prefix (``ObjectCreated:Put``), and at least one is required;
- the key filter is ``<Filter><Object><FilterRule>`` with ``prefix`` and ``suffix`` rules
  only: no regex, no metadata or tag filters;
- the document has no XML namespace, and a configuration's elements come in the order Id,
  Filter, Topic, Event.

Within the service the S3 names are kept (``NotificationConfig`` is one normal form for
both); this module translates on the way out and back.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bucketnotify.gateway.notifications import NotificationConfig

__all__ = ["EVENTS", "URN", "problem", "render", "to_s3_event"]

URN = re.compile(r"^urn:smn:[^:]*:[^:]+:[^:]+$")

# What OBS takes (its documentation's list), by their S3 names.
EVENTS = frozenset(
    {
        "s3:ObjectCreated:*",
        "s3:ObjectCreated:Put",
        "s3:ObjectCreated:Post",
        "s3:ObjectCreated:Copy",
        "s3:ObjectCreated:CompleteMultipartUpload",
        "s3:ObjectRemoved:*",
        "s3:ObjectRemoved:Delete",
        "s3:ObjectRemoved:DeleteMarkerCreated",
    }
)

# An empty list in the normal form means these (as on Ceph); OBS needs them written out.
EVERY_EVENT = ("s3:ObjectCreated:*", "s3:ObjectRemoved:*")

KEY_RULES = frozenset({"prefix", "suffix"})


def problem(config: NotificationConfig) -> str | None:
    """What of ``config`` an OBS gateway cannot hold, as a message naming the spec field and
    the fix; None when it can hold all of it."""
    if not URN.match(config.topic_arn):
        return (
            f"topicARN {config.topic_arn!r} is not an SMN topic URN: an OBS gateway takes"
            " urn:smn:<region>:<project id>:<topic>"
        )
    regex = [rule for rule in config.key_filters if rule.name not in KEY_RULES]
    if regex:
        return "filter.key.regex: an OBS gateway filters keys by prefix and suffix only"
    if config.metadata_filters:
        return "filter.metadata: an OBS gateway has no metadata filters"
    if config.tag_filters:
        return "filter.tags: an OBS gateway has no tag filters"
    unknown = [event for event in config.events if event not in EVENTS]
    if unknown:
        return "events an OBS gateway does not know: " + ", ".join(unknown)
    return None


def _obs_event(event: str) -> str:
    return event.removeprefix("s3:")


def to_s3_event(event: str) -> str:
    """An event name as OBS reports it, under its S3 name."""
    return event if event.startswith("s3:") else f"s3:{event}"


def render(configs: Iterable[NotificationConfig]) -> bytes:
    """A NotificationConfiguration document in OBS's dialect. Raises ValueError for a
    configuration ``problem`` refuses: never sent half-translated."""
    root = ET.Element("NotificationConfiguration")
    for config in configs:
        refused = problem(config)
        if refused is not None:
            raise ValueError(f"notification {config.id}: {refused}")
        element = ET.SubElement(root, "TopicConfiguration")
        ET.SubElement(element, "Id").text = config.id
        if config.key_filters:
            rules = ET.SubElement(ET.SubElement(element, "Filter"), "Object")
            for rule in config.key_filters:
                rule_element = ET.SubElement(rules, "FilterRule")
                ET.SubElement(rule_element, "Name").text = rule.name
                ET.SubElement(rule_element, "Value").text = rule.value
        ET.SubElement(element, "Topic").text = config.topic_arn
        for event in config.events or EVERY_EVENT:
            ET.SubElement(element, "Event").text = _obs_event(event)
    document: bytes = ET.tostring(root, encoding="utf-8", xml_declaration=True)
    return document
