"""The move from kopf's default finalizer to ours: what each object needs."""

from __future__ import annotations

from bucketnotify.controller.finalizers import FINALIZER, OLD_FINALIZER, finalizer_move


def test_the_old_finalizer_goes_only_once_ours_holds_the_object() -> None:
    assert finalizer_move([OLD_FINALIZER, FINALIZER], deleting=False) == "drop"
    assert finalizer_move([FINALIZER, "other.example/f", OLD_FINALIZER], deleting=True) == "drop"
    # kopf adds ours at its first event; until then the old one keeps holding it.
    assert finalizer_move([OLD_FINALIZER], deleting=False) is None


def test_deleted_under_the_old_finalizer_alone_the_deletion_runs_first() -> None:
    assert finalizer_move([OLD_FINALIZER], deleting=True) == "delete"
    assert finalizer_move(["other.example/f", OLD_FINALIZER], deleting=True) == "delete"


def test_objects_without_the_old_finalizer_need_nothing() -> None:
    assert finalizer_move([FINALIZER], deleting=False) is None
    assert finalizer_move([], deleting=True) is None
    assert finalizer_move(["other.example/f"], deleting=True) is None
