"""The identities of the events a shard delivered last: what a round or a direct push checks
so that an event the gateway sends again is removed, not pushed twice."""

from __future__ import annotations

from collections import OrderedDict
from itertools import islice

__all__ = ["DeliveredCache"]


class DeliveredCache:
    """Event identities recently delivered from one shard (bounded, oldest forgotten)."""

    def __init__(self, size: int = 100_000) -> None:
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._size = size
        self.added = 0
        """Identities added so far: a saver compares it with what it saved."""
        self.unremoved: set[str] = set()
        """Queue entries (ids, not event identities) a round cut short delivered and
        counted: the next round removes them without a push, as no duplicate."""

    def __contains__(self, event_id: object) -> bool:
        return event_id in self._ids

    def add(self, event_id: str) -> None:
        self._ids[event_id] = None
        self._ids.move_to_end(event_id)
        self.added += 1
        while len(self._ids) > self._size:
            self._ids.popitem(last=False)

    def recent(self, count: int) -> list[str]:
        """The ``count`` identities added last, oldest first."""
        return list(islice(reversed(self._ids), count))[::-1]
