"""Our finalizer, ``bucketnotify.io/finalizer``, and the move from kopf's default one
(``kopf.zalando.org/KopfFinalizerMarker``), which releases before 0.1.0 put on every Topic
and BucketNotification.

kopf adds our finalizer to an object it handles that lacks it, and runs the deletion
handlers only of an object that carries it. An object of an earlier release therefore:

- not being deleted: gets ours from kopf at its first event; the drift check then removes
  the old one (once both are there, so the object is never without a finalizer of ours);
- being deleted with both: kopf runs the deletion handlers and removes ours; the old one is
  removed at once by the drift check, which sees both;
- being deleted with the old one alone (deleted while no operator ran, or before kopf got
  to it): a deleting object can get no new finalizer, so kopf would never handle it. The
  drift check runs the deletion handler itself, as kopf would, retried every drift interval
  while it fails, then removes the old finalizer and the object goes.

The JSON patches test the finalizer's position first: a finalizer another controller added
meanwhile is never lost.
"""

from __future__ import annotations

__all__ = ["FINALIZER", "OLD_FINALIZER", "finalizer_move"]

FINALIZER = "bucketnotify.io/finalizer"
OLD_FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"


def finalizer_move(finalizers: list[str], deleting: bool) -> str | None:
    """What an object with these finalizers needs: ``"drop"`` the old one (ours is there),
    ``"delete"`` (being deleted under the old one alone: run the deletion, then drop it), or
    None."""
    if OLD_FINALIZER not in finalizers:
        return None
    if FINALIZER in finalizers:
        return "drop"
    return "delete" if deleting else None
