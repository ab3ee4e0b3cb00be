"""Huawei OBS's dialect of the notification configuration, against the documented example.

OBS's PutBucketNotification documentation gives this request body (Id, an Object filter
with a prefix and a suffix rule, an SMN topic URN, an event without the ``s3:`` prefix):
what the operator renders for the same notification must be that document, and what it
reads from it must be the same notification in the service's normal form.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

import pytest

from bucketnotify.gateway import obs
from bucketnotify.gateway.notifications import (
    FilterRule,
    NotificationConfig,
    parse_configuration,
    render_configuration,
)

DOCUMENTED_EXAMPLE = b"""\
<NotificationConfiguration>
  <TopicConfiguration>
    <Id>ConfigurationId</Id>
    <Filter>
      <Object>
        <FilterRule>
          <Name>prefix</Name>
          <Value>object</Value>
        </FilterRule>
        <FilterRule>
          <Name>suffix</Name>
          <Value>txt</Value>
        </FilterRule>
      </Object>
    </Filter>
    <Topic>urn:smn:region:4b29a3cb5bd64581bda5714566814bb7:tet555</Topic>
    <Event>ObjectCreated:Put</Event>
  </TopicConfiguration>
</NotificationConfiguration>
"""

EXAMPLE = NotificationConfig(
    id="ConfigurationId",
    topic_arn="urn:smn:region:4b29a3cb5bd64581bda5714566814bb7:tet555",
    events=("s3:ObjectCreated:Put",),
    key_filters=(FilterRule("prefix", "object"), FilterRule("suffix", "txt")),
)


def tree(document: bytes) -> Any:
    """Tags, texts and children in order: the document without layout whitespace."""

    def walk(element: ET.Element) -> Any:
        text = (element.text or "").strip()
        return (element.tag, text, [walk(child) for child in element])

    return walk(ET.fromstring(document))  # noqa: S314 - a test's own document


def test_the_rendered_document_is_the_documented_example() -> None:
    assert tree(render_configuration([EXAMPLE], "obs")) == tree(DOCUMENTED_EXAMPLE)


def test_the_documented_example_reads_as_the_same_notification() -> None:
    assert parse_configuration(DOCUMENTED_EXAMPLE, "obs") == [EXAMPLE]


def test_every_event_is_written_out_and_read_back_as_the_empty_list() -> None:
    """The API's empty list means every ObjectCreated and ObjectRemoved event; OBS needs at
    least one Event element, so both wildcards are written, and read back as ()."""
    config = NotificationConfig("all", EXAMPLE.topic_arn, events=())
    document = render_configuration([config], "obs")
    events = [e.text for e in ET.fromstring(document).iter("Event")]  # noqa: S314
    assert events == ["ObjectCreated:*", "ObjectRemoved:*"]
    assert "Filter" not in document.decode()
    assert parse_configuration(document, "obs") == [config]


def test_several_notifications_keep_their_order_and_no_namespace() -> None:
    configs = [
        EXAMPLE,
        NotificationConfig(
            "deletes", "urn:smn:r:p:t2", events=("s3:ObjectRemoved:DeleteMarkerCreated",)
        ),
    ]
    document = render_configuration(configs, "obs")
    root = ET.fromstring(document)  # noqa: S314
    assert root.tag == "NotificationConfiguration", "OBS's document has no XML namespace"
    assert [child.find("Id").text for child in root] == ["ConfigurationId", "deletes"]  # type: ignore[union-attr]
    assert parse_configuration(document, "obs") == configs


def test_an_empty_configuration_turns_notifications_off() -> None:
    """What a deletion of the last Id writes (OBS has no DELETE of one Id)."""
    assert tree(render_configuration([], "obs")) == ("NotificationConfiguration", "", [])


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            NotificationConfig("x", "arn:aws:sns:default::orders", events=()),
            "topicARN 'arn:aws:sns:default::orders' is not an SMN topic URN: an OBS gateway"
            " takes urn:smn:<region>:<project id>:<topic>",
        ),
        (
            NotificationConfig(
                "x", "urn:smn:r:p:t", events=(), key_filters=(FilterRule("regex", "a.*"),)
            ),
            "filter.key.regex: an OBS gateway filters keys by prefix and suffix only",
        ),
        (
            NotificationConfig(
                "x",
                "urn:smn:r:p:t",
                events=(),
                metadata_filters=(FilterRule("x-amz-meta-team", "a"),),
            ),
            "filter.metadata: an OBS gateway has no metadata filters",
        ),
        (
            NotificationConfig(
                "x", "urn:smn:r:p:t", events=(), tag_filters=(FilterRule("team", "a"),)
            ),
            "filter.tags: an OBS gateway has no tag filters",
        ),
    ],
)
def test_what_obs_cannot_hold_is_refused_by_name_and_never_rendered(
    config: NotificationConfig, message: str
) -> None:
    assert obs.problem(config) == message
    with pytest.raises(ValueError, match="notification x: "):
        render_configuration([config], "obs")


def test_the_ceph_dialect_is_unchanged_by_the_kind() -> None:
    """The default stays the S3 document Ceph reads (namespace, S3Key, s3: names)."""
    document = render_configuration([EXAMPLE]).decode()
    assert "http://s3.amazonaws.com/doc/2006-03-01/" in document
    assert "<S3Key>" in document and "<Event>s3:ObjectCreated:Put</Event>" in document
    assert parse_configuration(document.encode()) == [EXAMPLE]
