"""Who of several writers may hold a notification Id on a bucket."""

from __future__ import annotations

from bucketnotify.controller.id_ownership import (
    EntryHolder,
    IdClaim,
    cluster_refusal,
    gateway_refusal,
    id_owner,
)

OLD = IdClaim("ns-b", "old", "2026-01-01T00:00:00Z", holds=False)
NEW = IdClaim("ns-a", "new", "2026-02-01T00:00:00Z", holds=False)


def test_the_holder_wins_over_an_older_claim_and_else_the_oldest() -> None:
    holder = IdClaim("ns-z", "holder", "2026-03-01T00:00:00Z", holds=True)
    assert id_owner([OLD, NEW]) == OLD
    assert id_owner([NEW, OLD, holder]) == holder
    same_time = IdClaim("ns-a", "twin", OLD.created, holds=False)
    assert id_owner([OLD, same_time]) == same_time  # ties by namespace, then name


def test_the_loser_is_told_who_owns_the_id() -> None:
    assert cluster_refusal(OLD, [NEW], "b1", "x") is None
    refusal = cluster_refusal(NEW, [OLD], "b1", "x")
    assert refusal is not None and "BucketNotification ns-b/old" in refusal


def refusal(holder: EntryHolder, *, held_before: bool = False, adopt: bool = False) -> str | None:
    return gateway_refusal(
        [holder], bucket="b1", id="x", owner_id="me", held_before=held_before, adopt=adopt
    )


def test_an_entry_of_this_operator_is_taken() -> None:
    assert refusal(EntryHolder("arn:aws:sns:zg::other", "me")) is None


def test_an_entry_of_another_operator_is_never_taken() -> None:
    theirs = EntryHolder("arn:aws:sns:zg::t", "cluster-b")
    for held_before, adopt in ((False, False), (True, False), (False, True)):
        message = refusal(theirs, held_before=held_before, adopt=adopt)
        assert message is not None and "another bucketnotify operator (owner cluster-b" in message


def test_an_unmarked_entry_is_taken_when_adopted_or_once_held() -> None:
    hand_made = EntryHolder("arn:aws:sns:zg::hand", None)
    message = refusal(hand_made)
    assert message is not None and "adoptExisting" in message
    assert refusal(hand_made, adopt=True) is None
    assert refusal(hand_made, held_before=True) is None  # a hand edit of ours: drift
