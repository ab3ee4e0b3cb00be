"""Writes and fsyncs that the kernel runs for the event loop, without a thread of ours.

Why not the store's threads: a call in a thread gives up the GIL around each system call
and must win it back from the busy event loop, and the thread's wake-up and its result
cost a few more hand-overs: context switches, most of them futex waits of that
contention, that submitting the commit's write and fsyncs here saves
(docs/performance-notes.md).

caio submits to io_uring, or Linux AIO where io_uring is refused (seccomp profiles of
container runtimes often refuse it), and the completion wakes the loop through an eventfd.
Where neither can be set up, or off Linux, the calls go to the store's threads as before.
Either way the system call is the same ``write``/``fsync``: durability does not change.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from typing import Any

from bucketnotify.delivery.stores._threads import IOThreads

__all__ = ["Ring", "write_all_blocking"]

log = logging.getLogger(__name__)

MAX_REQUESTS = 256
"""Operations in flight at once per event loop; more wait for a free slot."""


class Ring:
    """``write_all`` and ``fsync`` for descriptors, on the running loop's ring when it has
    one, else in ``threads``. ``enabled=False`` always uses the threads."""

    def __init__(self, threads: IOThreads, *, enabled: bool = True) -> None:
        self._threads = threads
        self._enabled = enabled
        self._loop: asyncio.AbstractEventLoop | None = None
        self._context: Any = None

    @property
    def kind(self) -> str:
        """What the running loop's calls use: ``io_uring``, ``linux-aio`` or ``threads``."""
        context = self._context_of(asyncio.get_running_loop())
        if context is None:
            return "threads"
        return "io_uring" if "uring" in type(context).__module__ else "linux-aio"

    async def fsync(self, fd: int) -> None:
        context = self._context_of(asyncio.get_running_loop())
        if context is None:
            await self._threads.run(os.fsync, fd)
            return
        try:
            await context.fsync(fd)
        except SystemError as exc:
            raise _os_error(exc) from None

    async def write_all(self, fd: int, data: bytes) -> None:
        """All of ``data`` at the start of the (new, empty) file ``fd``."""
        context = self._context_of(asyncio.get_running_loop())
        if context is None:
            await self._threads.run(write_all_blocking, fd, data)
            return
        offset = 0
        while offset < len(data):
            try:
                written = await context.write(data[offset:] if offset else data, fd, offset)
            except SystemError as exc:
                raise _os_error(exc) from None
            if not written:
                raise OSError(f"write of {len(data) - offset} bytes wrote nothing")
            offset += written

    def _context_of(self, loop: asyncio.AbstractEventLoop) -> Any:
        if not self._enabled:
            return None
        if self._loop is not loop:
            # First use, or another loop (tests run one per test): a context registers its
            # eventfd with one loop.
            self._loop, self._context = loop, _new_context(loop)
        return self._context


def _new_context(loop: asyncio.AbstractEventLoop) -> Any:
    try:
        from caio import linux_aio_asyncio, linux_uring_asyncio
    except ImportError:
        return None
    reasons = []
    # No SQPOLL: its kernel thread polls the ring, a core's worth of CPU while busy.
    for kind, make in (
        (
            "io_uring",
            lambda: linux_uring_asyncio.AsyncioContext(  # type: ignore[no-untyped-call]
                MAX_REQUESTS, loop=loop, sqpoll=False
            ),
        ),
        (
            "Linux AIO",
            lambda: linux_aio_asyncio.AsyncioContext(MAX_REQUESTS, loop=loop),  # type: ignore[no-untyped-call]
        ),
    ):
        try:
            context = make()
        except Exception as exc:  # refused by the kernel or a seccomp profile
            reasons.append(f"{kind}: {type(exc).__name__}: {exc}")
            continue
        log.info("store writes and fsyncs go through %s", kind)
        return context
    log.warning("no io_uring or Linux AIO here (%s): store fsyncs run in threads", reasons)
    return None


_ERRNO_OF = {os.strerror(code): code for code in errno.errorcode}


def _os_error(exc: SystemError) -> OSError:
    """caio reports the kernel's error as ``SystemError(strerror(errno))``: the ``OSError``
    ``os.write`` or ``os.fsync`` would have raised, so that callers can tell a full disk
    (``ENOSPC``, answered with 503) from the rest."""
    message = str(exc)
    code = _ERRNO_OF.get(message)
    return OSError(code, message) if code is not None else OSError(message)


def write_all_blocking(fd: int, data: bytes) -> None:
    """All of ``data`` with ``os.write``: a write of a regular file is short only when the
    disk filled or a signal came."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
