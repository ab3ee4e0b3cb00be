"""What the demo prints: numbered steps, indented details, and the one error it stops with."""

from __future__ import annotations

import time

__all__ = ["DemoError", "Ticker", "indent", "info", "step"]


class DemoError(RuntimeError):
    """The demo cannot go on; the message says what failed and where its log is."""


_STARTED = time.monotonic()


def step(text: str) -> None:
    print(f"\n==> [{time.monotonic() - _STARTED:4.0f} s] {text}", flush=True)


def info(text: str) -> None:
    print(f"    {text}", flush=True)


def indent(text: str) -> str:
    return "\n".join(f"      {line}" for line in text.rstrip().splitlines())


class Ticker:
    """A "still waiting (N s)" line every ``every`` seconds, so a slow step shows life."""

    def __init__(self, what: str, every: float = 10) -> None:
        self._what = what
        self._every = every
        self._started = time.monotonic()
        self._next = self._started + every

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self._started

    def tick(self, detail: str = "") -> None:
        now = time.monotonic()
        if now >= self._next:
            self._next = now + self._every
            info(f"... {self._what} ({self.elapsed:.0f} s){': ' + detail if detail else ''}")
