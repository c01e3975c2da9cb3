"""The session notebook keeps a bounded part of what calls printed (issue 22 item 6)."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import nbformat

from kernel_sandbox.limits import (
    NOTEBOOK_CALL_IMAGES,
    NOTEBOOK_CALL_OUTPUT_BYTES,
    NOTEBOOK_IMAGE_BYTES,
)
from kernel_sandbox.notebook.budget import OutputBudget, output_size
from kernel_sandbox.notebook.recorder import NotebookRecorder
from kernel_sandbox.results import Execution

MiB = 1024**2


def _execution(outputs: list[dict[str, object]]) -> Execution:
    return Execution(status="ok", execution_count=1, outputs=outputs)  # type: ignore[arg-type]


def _stream(size: int) -> dict[str, object]:
    return {"output_type": "stream", "name": "stdout", "text": "x" * (size - 4) + "END\n"}


def _png(size: int) -> dict[str, object]:
    data = base64.b64encode(b"\0" * (size * 3 // 4)).decode()
    return {"output_type": "display_data", "data": {"image/png": data, "text/plain": "<F>"}}


def test_one_call_keeps_its_ends_within_the_per_call_cap() -> None:
    kept = OutputBudget().take([_stream(10 * MiB)])
    assert sum(output_size(o) for o in kept) <= NOTEBOOK_CALL_OUTPUT_BYTES + 1024
    assert kept[0]["text"].startswith("xxx") and kept[0]["text"].endswith("END\n")
    assert "not recorded" in kept[0]["text"] and "not recorded" in kept[-1]["text"]


def test_images_past_the_count_keep_their_text() -> None:
    kept = OutputBudget().take([_png(10_000) for _ in range(NOTEBOOK_CALL_IMAGES + 5)])
    images = [o for o in kept if "image/png" in o.get("data", {})]
    texts = [o for o in kept if o.get("data") == {"text/plain": "<F>"}]
    assert (len(images), len(texts)) == (NOTEBOOK_CALL_IMAGES, 5)
    assert "image(s) recorded as text only" in kept[-1]["text"]


def test_an_image_over_the_size_cap_keeps_its_text() -> None:
    small, large = _png(10_000), _png(NOTEBOOK_IMAGE_BYTES + 1024)
    kept = OutputBudget().take([small, large])
    assert kept[0] == small and kept[1] == {
        "output_type": "display_data",
        "data": {"text/plain": "<F>"},
    }
    assert "1 image(s) recorded as text only" in kept[-1]["text"]


def test_a_long_session_stops_recording_outputs_at_the_notebooks_cap(tmp_path: Path) -> None:
    path = tmp_path / "s.ipynb"
    recorder = NotebookRecorder(path)
    total = 4 * NOTEBOOK_CALL_OUTPUT_BYTES  # NOTEBOOK_MAX_OUTPUT_BYTES, scaled to stay fast
    recorder._budget = OutputBudget(total)
    calls = 3 * total // NOTEBOOK_CALL_OUTPUT_BYTES
    times = []
    for i in range(calls):
        started = time.perf_counter()
        recorder.add_python(f"print('x' * {10 * MiB})  # {i}", _execution([_stream(10 * MiB)]))
        times.append(time.perf_counter() - started)
    size = path.stat().st_size
    print(
        f"\n{calls} calls of 10 MiB: notebook {size / MiB:.1f} MiB, "
        f"first write {times[0]:.3f} s, last {times[-1]:.3f} s"
    )
    assert size <= total + MiB
    nb = nbformat.read(path, as_version=4)
    assert len([c for c in nb.cells if c.cell_type == "code"]) == calls  # every call kept
    assert "holds its maximum" in json.dumps(nb.cells[-1].outputs)
