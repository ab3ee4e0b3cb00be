"""The pause before an event's next attempt (``DeliveryPolicy.retry_delay``): fixed as the
gateway's ``retrySleepDuration``, or doubling per retry up to the cap with equal jitter."""

from __future__ import annotations

import random

import pytest

from bucketnotify.delivery.model.outcomes import DeliveryPolicy


def test_fixed_is_retry_sleep_duration_every_time() -> None:
    policy = DeliveryPolicy(retry_sleep_s=7)
    assert [policy.retry_delay(n) for n in (1, 2, 10, 100)] == [7.0] * 4


@pytest.mark.parametrize("draw", [0.0, 1.0])
def test_exponential_doubles_each_retry_up_to_the_cap_within_its_jitter(draw: float) -> None:
    policy = DeliveryPolicy(retry_sleep_s=2, backoff="exponential", max_retry_sleep_s=30)
    steps = [2, 4, 8, 16, 30, 30]
    delays = [policy.retry_delay(n, lambda: draw) for n in range(1, 7)]
    # draw 0: half the step (the least a pause can be); draw 1: the whole step.
    assert delays == [step * (0.5 + draw / 2) for step in steps]


def test_exponential_pauses_spread_between_half_and_all_of_the_step() -> None:
    policy = DeliveryPolicy(retry_sleep_s=1, backoff="exponential", max_retry_sleep_s=300)
    draws = random.Random(7)
    delays = [policy.retry_delay(4, draws.random) for _ in range(1000)]
    assert min(delays) >= 4 and max(delays) <= 8
    assert max(delays) - min(delays) > 3, "the jitter spreads events that failed together"


def test_exponential_without_a_sleep_duration_starts_at_one_second_and_never_overflows() -> None:
    policy = DeliveryPolicy(backoff="exponential", max_retry_sleep_s=60)
    assert policy.retry_delay(1, lambda: 1.0) == 1.0
    assert policy.retry_delay(10_000, lambda: 1.0) == 60.0
