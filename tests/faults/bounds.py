"""What the fault tests allow, in one place: docs/operator.md's "Fault bounds" table quotes
these numbers, and tests/unit/test_fault_bounds.py fails when the table and this module
differ. A bound changes here, with its reason, or not at all: a test that fails against it
has found a defect or a doc that promised too much, never a bound to widen."""

from __future__ import annotations

from bucketnotify.delivery.rounds.worker import PROGRESS_S
from bucketnotify.settings import DeliveryServiceSettings

PER_SECOND = 16
"""Writes per second of the fault tests' stream, over its two Topics: steady, well below
what the path sustains, so that what a fault does is not hidden by a backlog."""

KILL_REPEAT_WINDOW_S = 3.0
"""A replica killed with SIGKILL may have pushed events it had not yet recorded: what the
endpoint acknowledged in the last PROGRESS_S (0.5 s) of its round, plus the removal then
under way on the queue store (measured up to 2.2 s between acknowledgement and kill on a
busy machine). Only an event whose first copy arrived within this window before a kill may
arrive again."""

REPEATS_PER_KILL = int(PER_SECOND * KILL_REPEAT_WINDOW_S)
"""At most what the stream writes in one ``KILL_REPEAT_WINDOW_S``: a kill cannot repeat
more than its victim could have pushed unrecorded."""

REPEATS_PER_1000 = 30
"""Repeats over every acknowledged write of the replica-kill test (four kills), per 1,000.
Measured: 0 to 21.7 per 1,000 (0 in every run since the removals run during a round)."""

RABBITMQ_CONFIRM_WINDOW_S = 5.0
"""How long before a RabbitMQ shutdown a write's push may still await its confirm: the
gateway's hand-off and a delivery round at the stream's rate take well under a second, the
rest is room for a busy machine. Only such a write may be delivered twice."""

RABBITMQ_REPEATS_PER_TOPIC = 8
"""At most one second of a Topic's writes (the stream gives each of its two Topics 8 a
second) may be awaiting a confirm when the broker shuts down: pushes go out as their writes
come, each confirmed within milliseconds. Measured: 0 to 2 per restart."""

STALE_CONNECTION_S = 0.5
"""How long after a kill a Ceph 20.2 gateway may still push a sync event over a kept-alive
connection to the killed replica, losing it (measured: up to 0.14 s)."""


def _default(name: str) -> float:
    """A delivery setting's default, as the fault tests' replicas run it (never this
    process's environment)."""
    value = DeliveryServiceSettings.model_fields[name].default
    assert isinstance(value, int | float), name
    return float(value)


LATE_COPY_SWEEP_S = (
    # A killed replica's partitions: its Leases expire, a survivor takes them at its next
    # renewal, its first round polls them and pushes what was not recorded. The gateway's
    # own persistent queue sends a push it saw fail again without a pause (its
    # ``rgw_topic_persistency_sleep_duration`` is 0 unless set, and the test gateways do
    # not set it): the 5 s after cover that and the push itself.
    _default("lease_duration_seconds")
    + _default("renew_interval_seconds")
    + _default("idle_poll_max_seconds")
    + PROGRESS_S
    + 5.0
)
"""How long after a fault ended every fault test still looks for copies: past the last
moment a repeat could be sent, plus a few seconds for its push."""
