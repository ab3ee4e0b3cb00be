"""The end every benchmark shares (bench/guarded.py): what it started is stopped whatever
happens, and the exit status says how it ended."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from bench import guarded as guarded_module
from bench.guarded import guarded

from devstack.services import Service, ServiceError


@pytest.fixture()
def stopped(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    names: list[str] = []
    monkeypatch.setattr(guarded_module, "stop_service", lambda s: names.append(s.name))
    return names


def starts_then(outcome: BaseException | int) -> Callable[[list[Service]], int]:
    def measure(started: list[Service]) -> int:
        started.append(Service(name="ceph", env={}, started_here=True))
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    return measure


@pytest.mark.parametrize(
    ("outcome", "status", "said"),
    [
        (0, 0, ""),
        (1, 1, ""),
        (ServiceError("kafka did not start"), 2, "bench: a local service is missing: kafka"),
        (KeyboardInterrupt(), 130, "bench: interrupted; stopped what it started"),
    ],
)
def test_what_was_started_is_stopped_and_the_status_says_how_it_ended(
    stopped: list[str],
    capsys: pytest.CaptureFixture[str],
    outcome: BaseException | int,
    status: int,
    said: str,
) -> None:
    assert guarded("bench", starts_then(outcome)) == status
    assert stopped == ["ceph"]
    assert said in capsys.readouterr().err


def test_a_setup_error_of_its_own_is_status_2_with_its_words(
    stopped: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    class SetupError(Exception):
        pass

    measure = starts_then(SetupError("3 of 10 Topics Ready after 60 s"))
    assert guarded("bench.idle", measure, (SetupError,)) == 2
    assert stopped == ["ceph"]
    assert "bench.idle: 3 of 10 Topics Ready after 60 s" in capsys.readouterr().err
