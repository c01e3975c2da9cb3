"""make bench-quick's gate: a ratio worse than the baseline by more than its margin fails."""

from __future__ import annotations

import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import quick  # noqa: E402

BASE = {"print_vs_local": 0.5, "cold_vs_docker": 1.5}


def verdicts(now: dict[str, float]) -> dict[str, bool]:
    return {name: bad for name, _, bad in quick.compare(now, BASE)}


def test_inside_the_margins_passes() -> None:
    now = {"print_vs_local": 0.6, "cold_vs_docker": 2.3}
    assert verdicts(now) == dict.fromkeys(BASE, False)


def test_lower_is_better_ratios_fail_above_their_margin() -> None:
    assert verdicts(dict(BASE, print_vs_local=0.5 * 1.36)) == {
        "print_vs_local": True,
        "cold_vs_docker": False,
    }
    assert verdicts(dict(BASE, cold_vs_docker=1.5 * 1.61))["cold_vs_docker"]


def test_improvements_pass_and_throughput_never_gates() -> None:
    assert not any(verdicts({"print_vs_local": 0.1, "cold_vs_docker": 1.0}).values())
    assert "throughput16_x_local" not in quick.MARGINS
    assert "throughput16_x_local" in quick.REPORTED


def test_committed_baseline_has_every_gated_ratio() -> None:
    baseline = json.loads(quick.BASELINE.read_text())
    assert set(quick.MARGINS) | set(quick.REPORTED) <= set(baseline["ratios"])
    assert all(value > 0 for value in baseline["ratios"].values())
