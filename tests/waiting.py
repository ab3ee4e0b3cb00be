"""Polling for an eventual state, with the last observation in the failure message."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    observe: Callable[[], T],
    done: Callable[[T], bool],
    timeout: float,
    what: str,
    interval: float = 0.3,
) -> T:
    deadline = time.monotonic() + timeout
    while True:
        seen = observe()
        if done(seen):
            return seen
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout}s waiting for {what}; last seen: {seen}"
            )
        time.sleep(interval)
