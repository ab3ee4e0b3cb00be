"""The ingest tokens of the Topics a replica serves: read from each Topic's token Secret,
kept with the ``IngestTopic`` whose ``accepts`` checks each push's token (in constant time),
and read again when a push brings a token this replica does not hold (``recheck``).

A rotated token is still taken for ``token_overlap_s``: the gateway pushes with it until the
operator has rewritten the gateway topic. A deleted Secret keeps the token held until the
operator has made a new one (with hand-off sync a refused push is an event lost).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from dataclasses import dataclass, field, replace

from bucketnotify.api.topic import INGEST_TOKEN_KEY, PREVIOUS_TOKEN_KEY, ingest_token_secret
from bucketnotify.delivery.model.queue import QueueName
from bucketnotify.kube.objects import Kube, SecretMissing

__all__ = ["TOKEN_READ_TIMEOUT_S", "TOKEN_RECHECK_S", "IngestTokens", "IngestTopic", "TopicKey"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IngestTopic:
    """What the ingest needs to know about one persistent Topic."""

    queue: QueueName
    token: str = field(repr=False)
    shards: int
    previous: str | None = field(default=None, repr=False)
    """The token Secret's ``previous-token``: taken as long as the Secret holds it, for
    pushes the gateway queued with the old push-endpoint before a rotation."""
    replaced: str | None = field(default=None, repr=False)
    """The token ``token`` replaced, taken until ``replaced_until`` (monotonic): the
    gateway keeps pushing with it until the operator has rewritten its topic."""
    replaced_until: float = 0.0
    read_at: float = 0.0
    """When the Secret was read (monotonic): an unknown token re-reads it at most once a
    second."""

    def accepts(self, token: str) -> bool:
        given = token.encode()
        # Every candidate is compared, so the time taken does not say which one matched.
        ok = hmac.compare_digest(given, self.token.encode())
        if self.previous:
            ok |= hmac.compare_digest(given, self.previous.encode())
        if self.replaced is not None and time.monotonic() < self.replaced_until:
            ok |= hmac.compare_digest(given, self.replaced.encode())
        return ok


TopicKey = tuple[str, str]

TOKEN_RECHECK_S = 1.0
TOKEN_READ_TIMEOUT_S = 5.0


class IngestTokens:
    """Token state of the ingest's Topics (``topics``, shared with the ingest)."""

    def __init__(self, kube: Kube, topics: dict[TopicKey, IngestTopic], overlap_s: float) -> None:
        self._kube = kube
        self.topics = topics
        self._overlap_s = overlap_s
        self._reads: dict[TopicKey, asyncio.Task[None]] = {}
        """Token Secret reads under way (``recheck``), one per Topic at most."""

    async def read(self, key: TopicKey, kube: Kube | None = None) -> dict[str, str]:
        """The token Secret's data ({} before the operator made it); read with ``kube``
        when given (``Kube.reading_from``: from a list of the namespace's Secrets)."""
        try:
            return await (kube or self._kube).secret_data(key[0], ingest_token_secret(key[1]))
        except SecretMissing:
            return {}  # the operator has not created it yet

    def take(
        self,
        key: TopicKey,
        queue: QueueName,
        shards: int,
        secret: dict[str, str],
        read_at: float,
    ) -> None:
        """Take the token Secret's data, read from ``read_at`` (monotonic, when the read
        began: a push that came before then is answered by it)."""
        token = secret.get(INGEST_TOKEN_KEY)
        old = self.topics.get(key)
        if not token and old is not None:
            # The Secret was deleted and the operator is making it again with a new token:
            # until the gateway topic has that one, the gateway pushes with the token held
            # here, and with hand-off sync a refused push is an event lost.
            self.topics[key] = replace(old, queue=queue, shards=shards, read_at=read_at)
            return
        if not token:
            return
        now = time.monotonic()
        replaced, until = None, 0.0
        if old is not None and old.token != token:
            replaced, until = old.token, now + self._overlap_s
            log.info("the ingest token of topic %s/%s was rotated", *key)
        elif old is not None:
            replaced, until = old.replaced, old.replaced_until
        self.topics[key] = IngestTopic(
            queue,
            token,
            shards,
            previous=secret.get(PREVIOUS_TOKEN_KEY) or None,
            replaced=replaced,
            replaced_until=until,
            read_at=read_at,
        )

    async def recheck(
        self, namespace: str, name: str, since: float | None = None
    ) -> IngestTopic | None:
        """The Topic as a read of its token Secret begun at or after ``since`` (monotonic;
        default now) found it: a push came at ``since`` with a token this replica does not
        hold.

        The operator writes the Secret before it gives the gateway the token, so such a read
        sees every token the gateway can push with. Reads are one a second per Topic at
        most (a sender guessing tokens costs few API calls); a push that comes within the
        second waits for the next read instead of being refused, and pushes that come
        together share one read: after a rotation the gateway sends many with the new token
        at once, and with hand-off sync a refused push is an event lost."""
        key = (namespace, name)
        since = time.monotonic() if since is None else since
        while True:
            current = self.topics.get(key)
            if current is None or current.read_at >= since:
                return current
            read = self._reads.get(key)
            if read is None or read.done():
                read = asyncio.create_task(
                    self._reread(key, not_before=current.read_at + TOKEN_RECHECK_S)
                )
                self._reads[key] = read
                read.add_done_callback(
                    lambda done: (
                        self._reads.pop(key, None) if self._reads.get(key) is done else None
                    )
                )
            # A read under way that began before ``since`` may miss the token: then the
            # loop waits for the next one.
            await asyncio.shield(read)

    async def _reread(self, key: TopicKey, not_before: float) -> None:
        await asyncio.sleep(max(0.0, not_before - time.monotonic()))
        started = time.monotonic()
        try:
            # Bounded: the pushes waiting for it must not hang on an API server that does
            # not answer (the gateway's own push timeout would then decide).
            async with asyncio.timeout(TOKEN_READ_TIMEOUT_S):
                secret = await self.read(key)
        except Exception as exc:  # the API server unreachable: answer with what is known
            log.warning("cannot read the ingest token of topic %s/%s: %s", *key, exc)
            current = self.topics.get(key)
            if current is not None:
                self.topics[key] = replace(current, read_at=started)
            return
        latest = self.topics.get(key)
        if latest is not None:  # not retired meanwhile
            self.take(key, latest.queue, latest.shards, secret, started)
