"""Which Events the operator's handlers post (bucketnotify.controller.events)."""

from __future__ import annotations

from typing import Any

from bucketnotify.controller.events import Event, change_events, drift_events

FAILING = {"type": "Ready", "status": "False", "reason": "GatewayUnreachable", "message": "m"}
READY = {"type": "Ready", "status": "True", "reason": "Synced", "message": "ok"}


def change(**given: Any) -> list[Event]:
    args: dict[str, Any] = {
        "kind": "topic",
        "cause": "create",
        "previous": None,
        "existed": False,
        "ready": True,
        "reason": "Synced",
        "message": "in sync",
        "retry": 0,
        **given,
    }
    return change_events(**args)


def test_first_sync_says_created_or_applied() -> None:
    assert change() == [Event("Normal", "Created", "in sync")]
    assert change(kind="notification") == [Event("Normal", "Applied", "in sync")]


def test_later_syncs_say_updated_on_a_change_and_synced_on_a_resume() -> None:
    assert change(existed=True, cause="update", previous=READY) == [
        Event("Normal", "Updated", "in sync")
    ]
    assert change(existed=True, cause="resume", previous=READY) == [
        Event("Normal", "Synced", "in sync")
    ]


def test_ready_after_a_failure_is_recovered_naming_the_failure() -> None:
    assert change(previous=FAILING, retry=3) == [
        Event("Normal", "Recovered", "Ready again after GatewayUnreachable"),
        Event("Normal", "Created", "in sync"),
    ]


def test_a_failure_is_posted_once_not_on_every_retry() -> None:
    failing = {"ready": False, "reason": "GatewayUnreachable", "message": "m"}
    assert change(**failing) == [Event("Warning", "GatewayUnreachable", "m")]
    assert change(**failing, previous=FAILING, retry=1) == []
    # A new change (retry 0), another reason or another message is posted again.
    assert change(**failing, previous=FAILING, retry=0) == [
        Event("Warning", "GatewayUnreachable", "m")
    ]
    assert change(**{**failing, "message": "other"}, previous=FAILING, retry=2) == [
        Event("Warning", "GatewayUnreachable", "other")
    ]


def test_drift_repaired_recovered_created_and_a_failure_only_after_ready() -> None:
    common: dict[str, Any] = {"kind": "topic", "reason": "Synced", "message": "in sync"}
    assert drift_events(**common, previous=READY, existed=True, ready=True, repaired=["topic"]) == [
        Event(
            "Warning",
            "DriftRepaired",
            "the gateway differed from the spec and was rewritten: topic",
        )
    ]
    assert drift_events(**common, previous=FAILING, existed=False, ready=True, repaired=[]) == [
        Event("Normal", "Recovered", "Ready again after GatewayUnreachable"),
        Event("Normal", "Created", "in sync"),
    ]
    failed: dict[str, Any] = {"kind": "topic", "reason": "GatewayUnreachable", "message": "m"}
    assert drift_events(**failed, previous=READY, existed=True, ready=False, repaired=[]) == [
        Event("Warning", "GatewayUnreachable", "m")
    ]
    assert drift_events(**failed, previous=FAILING, existed=True, ready=False, repaired=[]) == []
    assert drift_events(**common, previous=READY, existed=True, ready=True, repaired=[]) == []
