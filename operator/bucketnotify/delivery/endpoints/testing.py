"""A test double of the Endpoint interface, for unit tests of the code that drives endpoints.

Like httpx's ``MockTransport``: a handler decides what becomes of each delivery. It returns
(or, if async, resolves to) None for an acknowledgement and raises one of our errors for a
failure; outcomes are derived exactly as the real endpoints derive them (``outcome_of``), so
``RejectedError`` is retryable and ``UndeliverableError`` is not::

    def handler(delivery: Delivery) -> None:
        if delivery.record["s3"]["object"]["key"] == "too-big":
            raise UndeliverableError("too large")

    endpoint = MockEndpoint(handler)
    outcomes = await endpoint.send(batch)
    assert endpoint.delivered == [...]

Integration tests use the real servers instead.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType

from bucketnotify.delivery.endpoints.base import outcome_of
from bucketnotify.delivery.endpoints.errors import EndpointError
from bucketnotify.delivery.model.push import Delivery, PushOutcome

__all__ = ["Handler", "MockEndpoint"]

Handler = Callable[[Delivery], Awaitable[None] | None]


def _acknowledge(delivery: Delivery) -> None:
    return None


class MockEndpoint:
    """An Endpoint that asks ``handler`` about each delivery and records what happened."""

    def __init__(self, handler: Handler = _acknowledge) -> None:
        self._handler = handler
        self.batches: list[list[Delivery]] = []
        """Every batch ``send`` was given, in order."""
        self.delivered: list[Delivery] = []
        """The deliveries that were acknowledged, in order."""
        self.closed = False

    @classmethod
    def failing(cls, error: EndpointError) -> MockEndpoint:
        """An endpoint that fails every push with ``error``."""

        def handler(delivery: Delivery) -> None:
            raise error

        return cls(handler)

    async def send(self, batch: Sequence[Delivery]) -> list[PushOutcome]:
        if self.closed:
            raise RuntimeError("send() on a closed endpoint")
        self.batches.append(list(batch))
        outcomes = []
        for delivery in batch:
            try:
                result = self._handler(delivery)
                if inspect.isawaitable(result):
                    await result
            except EndpointError as exc:
                outcomes.append(outcome_of(delivery.id, exc))
            else:
                self.delivered.append(delivery)
                outcomes.append(outcome_of(delivery.id, None))
        return outcomes

    async def aclose(self) -> None:
        self.closed = True

    async def __aenter__(self) -> MockEndpoint:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
