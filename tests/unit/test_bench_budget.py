"""The delivery bench's throughput budget: what a throughput goal leaves for our processes."""

from __future__ import annotations

from typing import Any

from bench.delivery import throughput_budget


def _result(
    scenario: str, eps: float, received: int, span_s: float, **cpu: float
) -> dict[str, Any]:
    return {
        "scenario": scenario,
        "throughput_eps": eps,
        "received": received,
        "span_s": span_s,
        "cpu_s": {k.replace("_", "-"): v for k, v in cpu.items()},
    }


def test_the_budget_is_what_the_cores_give_at_the_goal_rate_less_the_other_processes() -> None:
    base = _result("gateway-sync", 500.0, 1000, 2.0, radosgw=1.5, receiver=0.2, bench=1.0)
    ours = _result(
        "bucketnotify-sync", 250.0, 1000, 4.0, radosgw=2.0, receiver=0.2, bench=1.0, replica_1=2.4
    )

    lines = throughput_budget([base, ours], cpus=2)

    figures = ours["throughput_budget"]
    # 0.9 x 500 = 450 events/s; 2 cores give 2000 / 450 = 4.44 ms per event in all; the
    # gateway, receiver and clients spent 3.2 ms per event: 1.24 ms left for ours (2.4 now).
    assert figures["rate_eps"] == 450.0
    assert round(figures["cpu_ms_per_event_available"], 2) == 4.44
    assert round(figures["others_ms"], 2) == 3.2
    assert round(figures["ours_budget_ms"], 2) == 1.24
    assert round(figures["ours_ms"], 2) == 2.4
    # 2.7 of 4 CPU seconds for the baseline, 5.6 of 8 for ours.
    assert round(figures["baseline_busy"], 3) == 0.675
    assert round(figures["busy"], 3) == 0.7
    assert "throughput_budget" not in base
    assert any(line.startswith("bucketnotify-sync ") and "1.24" in line for line in lines)


def test_no_budget_without_the_goal_baseline_in_the_run() -> None:
    ours = _result("bucketnotify-sync-s3", 200.0, 1000, 5.0, radosgw=6.0, replica_1=2.0)

    assert throughput_budget([ours], cpus=2) == []
    assert "throughput_budget" not in ours
