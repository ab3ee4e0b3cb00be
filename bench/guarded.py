"""The end every benchmark shares: the local services it started are stopped whatever
happens, a missing service or a failed setup is exit status 2 with the reason, and an
interrupt (Ctrl-C, or the SIGTERM a benchmark turns into one) is 130."""

from __future__ import annotations

import sys
from collections.abc import Callable

from devstack.services import Service, ServiceError
from devstack.services import stop as stop_service

__all__ = ["guarded"]


def guarded(
    name: str,
    measure: Callable[[list[Service]], int],
    setup_errors: tuple[type[Exception], ...] = (),
) -> int:
    """``measure(started)`` and its exit status; it appends each service it starts to
    ``started``. ``name`` begins the messages (``bench``, ``bench.idle``)."""
    started: list[Service] = []
    try:
        return measure(started)
    except ServiceError as exc:
        print(f"{name}: a local service is missing: {exc}", file=sys.stderr)
        return 2
    except setup_errors as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\n{name}: interrupted; stopped what it started", file=sys.stderr)
        return 130
    finally:
        for service in started:
            stop_service(service)
