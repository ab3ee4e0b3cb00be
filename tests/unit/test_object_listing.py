"""Reading a ListObjectsV2 page: Ceph answers in S3's XML namespace; an answer in none must
not read as an empty bucket (the store would then list no queue and deliver nothing)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from bucketnotify.gateway.objects import list_page_of

PAGE = """<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult{xmlns}>
  <Name>queues</Name><Prefix>q/</Prefix><KeyCount>2</KeyCount><MaxKeys>2</MaxKeys>
  <IsTruncated>{truncated}</IsTruncated>
  <Contents><Key>q/a &amp; b</Key><ETag>"9b2cf535f27731c974343645a3985328"</ETag></Contents>
  <Contents><Key>q/c</Key><ETag>"d41d8cd98f00b204e9800998ecf8427e"</ETag></Contents>
  <NextContinuationToken>MTox+Lw==</NextContinuationToken>
</ListBucketResult>"""


@pytest.mark.parametrize(
    "xmlns", [' xmlns="http://s3.amazonaws.com/doc/2006-03-01/"', ""], ids=["s3", "none"]
)
def test_keys_etags_and_the_next_token_in_any_namespace(xmlns: str) -> None:
    keys, token = list_page_of(PAGE.format(xmlns=xmlns, truncated="true").encode())
    assert keys == [
        ("q/a & b", '"9b2cf535f27731c974343645a3985328"'),
        ("q/c", '"d41d8cd98f00b204e9800998ecf8427e"'),
    ]
    assert token == "MTox+Lw=="


def test_a_page_that_is_not_truncated_has_no_next_token() -> None:
    _, token = list_page_of(PAGE.format(xmlns="", truncated="false").encode())
    assert token is None


def test_an_answer_that_is_no_xml_is_an_error_not_an_empty_page() -> None:
    with pytest.raises(ET.ParseError):
        list_page_of(b"<html>502 Bad Gateway")
