"""make bench-quick's gate: a ratio worse than the baseline by more than its margin fails."""

from __future__ import annotations

import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import quick  # noqa: E402

BASE = {"print_vs_local": 0.5, "cold_vs_docker": 1.5, "throughput16_x_local": 2.0}


def verdicts(now: dict[str, float]) -> dict[str, bool]:
    return {name: bad for name, _, bad in quick.compare(now, BASE)}


def test_inside_the_margins_passes() -> None:
    now = {"print_vs_local": 0.6, "cold_vs_docker": 1.9, "throughput16_x_local": 1.5}
    assert verdicts(now) == dict.fromkeys(BASE, False)


def test_lower_is_better_ratios_fail_above_their_margin() -> None:
    now = dict(BASE, print_vs_local=0.5 * 1.36, cold_vs_docker=1.5 * 1.41)
    assert verdicts(now) == {
        "print_vs_local": True,
        "cold_vs_docker": True,
        "throughput16_x_local": False,
    }


def test_throughput_fails_below_its_margin_and_improvements_pass() -> None:
    assert verdicts(dict(BASE, throughput16_x_local=2.0 * 0.59))["throughput16_x_local"]
    better = {"print_vs_local": 0.1, "cold_vs_docker": 1.0, "throughput16_x_local": 9.0}
    assert not any(verdicts(better).values())


def test_committed_baseline_has_every_gated_ratio() -> None:
    baseline = json.loads(quick.BASELINE.read_text())
    assert set(baseline["ratios"]) == set(quick.MARGINS)
    assert all(value > 0 for value in baseline["ratios"].values())
