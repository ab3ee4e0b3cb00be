"""A store's own worker threads for its blocking I/O.

Not the event loop's default executor: that one has min(32, cores + 4) threads (6 on two
cores) and is shared with everything else in the process that uses ``asyncio.to_thread``
or ``run_in_executor(None, ...)``, DNS lookups among them. A backlog of store calls there
(the ingest's fsyncs and the owners' rewrites under load) queued in front of them and once
delayed Lease renewals past the renew deadline, so the replica fenced itself. A store's
own bounded pool keeps its backlog to itself and bounds how many blocking calls it has
running at once.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

__all__ = ["IOThreads"]

P = ParamSpec("P")
T = TypeVar("T")


class IOThreads:
    """At most ``workers`` threads, started on first use; named ``<name>_<n>`` in dumps."""

    def __init__(self, name: str, workers: int) -> None:
        if workers < 1:
            raise ValueError(f"a store needs at least one I/O thread, not {workers}")
        self.workers = workers
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)

    async def run(self, call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``call(*args, **kwargs)`` in one of the threads. As with ``to_thread``, a
        cancelled caller stops waiting but the call itself runs to its end."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(call, *args, **kwargs))
