"""E2B metrics over a time range: the samples a sandbox keeps and which ones a range
answers (``kernel_sandbox.server.e2b.metrics.between``), without an engine."""

from __future__ import annotations

from kernel_sandbox.limits import E2B_METRICS_SAMPLES
from kernel_sandbox.server.e2b.metrics import between
from kernel_sandbox.server.e2b.models import SandboxMetric, iso
from kernel_sandbox.server.e2b.state import E2bSandbox


def _metric(second: int) -> SandboxMetric:
    return SandboxMetric(
        timestamp=iso(float(second)),
        timestamp_unix=second,
        cpu_count=1,
        cpu_used_pct=1.0,
        mem_used=1,
        mem_total=2,
        disk_used=1,
        disk_total=2,
    )


def _record() -> E2bSandbox:
    return E2bSandbox(
        id="s", owner="k", template="base", metadata={}, envs={},
        cpu_count=1, memory_mb=512, disk_mb=1024, end_at=0.0,
    )  # fmt: skip


def test_a_sandbox_keeps_its_newest_metrics_samples_up_to_the_cap() -> None:
    record = _record()
    for second in range(E2B_METRICS_SAMPLES + 80):
        record.samples.append(_metric(second))
    assert len(record.samples) == E2B_METRICS_SAMPLES
    assert record.samples[0].timestamp_unix == 80  # the oldest went first
    assert record.samples[-1].timestamp_unix == E2B_METRICS_SAMPLES + 79


def test_a_range_answers_the_samples_in_it_and_the_one_taken_for_it() -> None:
    samples = [_metric(s) for s in (100, 105, 110, 115)]
    assert [m.timestamp_unix for m in between(samples, None, None)] == [100, 105, 110, 115]
    assert [m.timestamp_unix for m in between(samples, 105, 110)] == [105, 110]  # both ends
    assert between(samples, 0, 99) == []  # before the sandbox: nothing
    fresh = _metric(121)  # measured for this ask, a second past the range's end
    assert [m.timestamp_unix for m in between([*samples, fresh], 112, 120, fresh)] == [115, 121]
