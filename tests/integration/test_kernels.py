"""R and JavaScript kernels in real sandboxes: the same behaviour as IPython's.

Each language's image (``kernel-sandbox:r``: IRkernel; ``kernel-sandbox:javascript``:
Deno) runs its kernel behind the sandbox's relay; everything above it is the code
every sandbox runs.  Both images hold python3 too, so mixed sessions run here.
"""

from __future__ import annotations

import asyncio
import base64
from dataclasses import dataclass
from typing import Any

import pytest
from click.testing import CliRunner

from kernel_sandbox.backends.docker import docker_client
from kernel_sandbox.backends.docker.images import builder
from kernel_sandbox.cli.main import cli
from kernel_sandbox.sandbox import AsyncSandbox
from tests.conftest import require

R_IMAGE = "kernel-sandbox:r"
JS_IMAGE = "kernel-sandbox:javascript"


@dataclass(frozen=True)
class Language:
    """What a test needs to say in one language."""

    image: str
    kernel: str
    language: str
    set_x: str  # x = 41
    show_x: str  # shows x + 1 as its result
    raise_boom: str  # an error "boom"
    busy_loop: str  # never ends by itself
    crash: str  # kills the kernel process
    print_lines: str  # prints "line 0".."line 2", a pause between
    print_started: str  # prints a line at once
    traceback_mark: str  # a line of the kernel's own traceback


R = Language(
    R_IMAGE,
    "ir",
    "r",
    "x <- 41",
    "x + 1",
    'f <- function() stop("boom"); f()',
    "repeat {}",
    "tools::pskill(Sys.getpid(), 9)",
    'for (i in 0:2) { cat("line", i, "\\n"); flush(stdout()); Sys.sleep(0.3) }',
    'cat("started\\n"); flush(stdout())',
    "f()",
)
JS = Language(
    JS_IMAGE,
    "deno",
    "javascript",
    "var x = 41",
    "x + 1",
    'function f() { throw new Error("boom") }; f()',
    "while (true) {}",
    'Deno.kill(Deno.pid, "SIGKILL")',
    "for (let i = 0; i < 3; i++) { console.log(`line ${i}`);"
    " await new Promise(r => setTimeout(r, 300)) }",
    'console.log("started")',
    "at f",
)
LANGUAGES = [pytest.param(R, id="r"), pytest.param(JS, id="javascript")]


def _require_image(image: str) -> None:
    present = builder.image_exists(docker_client(), image) is not None
    require(present, f"{image} is not built (kernel-sandbox images build r javascript)")


@pytest.fixture
async def kernel_sandbox(make_sandbox: Any, request: pytest.FixtureRequest) -> AsyncSandbox:
    lang: Language = request.param
    _require_image(lang.image)
    sandbox: AsyncSandbox = await make_sandbox(image=lang.image, kernel=lang.kernel, timeout=20)
    return sandbox


def _lang(request: pytest.FixtureRequest) -> Language:
    return request.node.callspec.params["kernel_sandbox"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("kernel_sandbox", LANGUAGES, indirect=True)
async def test_state_errors_and_streamed_output(
    kernel_sandbox: AsyncSandbox, request: pytest.FixtureRequest
) -> None:
    lang = _lang(request)
    assert kernel_sandbox.default_context.language == lang.language
    assert (await kernel_sandbox.run_code(lang.set_x)).status == "ok"
    shown = await kernel_sandbox.run_code(lang.show_x)
    assert shown.status == "ok" and "42" in shown.text and "\x1b[" not in shown.text
    failed = await kernel_sandbox.run_code(lang.raise_boom)
    assert failed.status == "error" and failed.error is not None
    assert "boom" in failed.error.evalue
    assert any(lang.traceback_mark in line for line in failed.error.traceback)
    seen: list[str] = []
    streamed = await kernel_sandbox.run_code(
        lang.print_lines, on_output=lambda o: seen.append(o.get("text", ""))
    )
    assert streamed.stdout.split() == ["line", "0", "line", "1", "line", "2"] or (
        streamed.stdout.splitlines() == ["line 0", "line 1", "line 2"]
    )
    assert len(seen) >= 2  # as it came, not all at the end
    assert "42" in (await kernel_sandbox.run_code(lang.show_x)).text


@pytest.mark.parametrize("kernel_sandbox", LANGUAGES, indirect=True)
async def test_a_timeout_interrupts_and_keeps_state(
    kernel_sandbox: AsyncSandbox, request: pytest.FixtureRequest
) -> None:
    lang = _lang(request)
    await kernel_sandbox.run_code(lang.set_x)
    busy = await kernel_sandbox.run_code(lang.busy_loop, timeout=3)
    assert busy.status == "timeout" and not busy.state_lost, busy.message
    assert "42" in (await kernel_sandbox.run_code(lang.show_x)).text
    # the host's own interrupt (a SIGINT for the relay to pass on, as the kernel wants)
    started = asyncio.Event()
    running = asyncio.ensure_future(
        kernel_sandbox.run_code(
            f"{lang.print_started}; {lang.busy_loop}",
            timeout=120,
            on_output=lambda _: started.set(),
        )
    )
    await asyncio.wait_for(started.wait(), 60)
    await kernel_sandbox.interrupt()
    interrupted = await asyncio.wait_for(running, 60)
    assert interrupted.status in ("error", "ok") and not interrupted.state_lost
    assert "42" in (await kernel_sandbox.run_code(lang.show_x)).text


@pytest.mark.parametrize("kernel_sandbox", LANGUAGES, indirect=True)
async def test_a_crash_is_detected_and_the_kernel_restarted(
    kernel_sandbox: AsyncSandbox, request: pytest.FixtureRequest
) -> None:
    lang = _lang(request)
    await kernel_sandbox.run_code(lang.set_x)
    crashed = await kernel_sandbox.run_code(lang.crash)
    assert crashed.status == "kernel_died" and crashed.state_lost
    assert "SIGKILL" in crashed.message and "restarted" in crashed.message
    after = await kernel_sandbox.run_code(lang.show_x)
    assert after.status == "error"  # x is gone, the kernel answers again


@pytest.mark.parametrize("kernel_sandbox", [pytest.param(R, id="r")], indirect=True)
async def test_r_ggplot_comes_back_as_png(kernel_sandbox: AsyncSandbox) -> None:
    plotted = await kernel_sandbox.run_code(
        "library(ggplot2)\nggplot(data.frame(a = 1:3, b = c(2, 1, 3)), aes(a, b)) + geom_point()",
        timeout=120,  # ggplot2's first load is slow on a loaded machine
    )
    assert plotted.status == "ok", plotted.error
    pngs = [o["data"]["image/png"] for o in plotted.outputs if "image/png" in o.get("data", {})]
    assert len(pngs) == 1 and base64.b64decode(pngs[0]).startswith(b"\x89PNG")


@pytest.mark.parametrize("kernel_sandbox", [pytest.param(JS, id="javascript")], indirect=True)
async def test_deno_display_sends_html_and_png(kernel_sandbox: AsyncSandbox) -> None:
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(16)).decode()
    shown = await kernel_sandbox.run_code(
        'await Deno.jupyter.display({"text/html": "<b>bold</b>"}, {raw: true});\n'
        f'await Deno.jupyter.display({{"image/png": "{png}"}}, {{raw: true}});\n'
        "Deno.jupyter.html`<i>tagged</i>`"
    )
    assert shown.status == "ok", shown.error
    data = [o.get("data", {}) for o in shown.outputs]
    assert data[0]["text/html"] == "<b>bold</b>" and data[1]["image/png"] == png
    assert "<i>tagged</i>" in data[2]["text/html"]


@pytest.mark.parametrize("kernel_sandbox", [pytest.param(JS, id="javascript")], indirect=True)
async def test_deno_outputs_after_the_idle_are_the_cells_within_bounds(
    kernel_sandbox: AsyncSandbox,
) -> None:
    # Deno publishes from a task of its own, so a cell's result can follow its idle
    # status; the relay holds the idle: output 20 ms after it is the cell's (LATE_QUIET)
    late = await kernel_sandbox.run_code('void setTimeout(() => console.log("late"), 20)')
    assert late.status == "ok" and late.stdout == "late\n"
    # a result is a cell's last output: its idle follows it at once
    shown = await kernel_sandbox.run_code('console.log("first"); 6 * 7')
    results = [
        o["data"]["text/plain"] for o in shown.outputs if o["output_type"] == "execute_result"
    ]
    assert shown.stdout == "first\n" and results == ["42"]
    # ... and a timer printing for ever holds its call at most LATE_LIMIT (1 s).
    started = asyncio.get_running_loop().time()
    ticking = await kernel_sandbox.run_code('void setInterval(() => console.log("tick"), 20)')
    took = asyncio.get_running_loop().time() - started
    assert ticking.status == "ok" and ticking.stdout.count("tick") >= 10
    assert took < 5, took


async def test_python_and_r_contexts_share_files_not_state(make_sandbox: Any) -> None:
    _require_image(R_IMAGE)
    sandbox: AsyncSandbox = await make_sandbox(image=R_IMAGE, timeout=60)
    await sandbox.run_python("x = 1\nopen('from_python.csv', 'w').write('a,b\\n1,2\\n3,4\\n')")
    r = await sandbox.run_code(
        "library(readr); d <- read_csv('from_python.csv', show_col_types = FALSE)\n"
        "write.csv(data.frame(s = sum(d$b)), 'from_r.csv', row.names = FALSE)\n"
        "exists('x')",
        language="r",
    )
    assert r.status == "ok" and "FALSE" in r.text
    back = await sandbox.run_python("import csv; print(list(csv.reader(open('from_r.csv'))))")
    assert back.stdout.strip() == "[['\"s\"'], ['6']]" or back.stdout.strip() == "[['s'], ['6']]"
    contexts = sandbox.list_contexts()
    assert [(c.language, c.kernel) for c in contexts] == [("python", "python3"), ("r", "ir")]
    await sandbox.restart()  # every kernel afresh, files kept
    assert (await sandbox.run_code("exists('d')", language="r")).text.endswith("FALSE")
    assert (await sandbox.run_python("import os; os.path.exists('from_r.csv')")).text == "True"


async def test_a_javascript_context_beside_python_reads_its_files(make_sandbox: Any) -> None:
    _require_image(JS_IMAGE)
    sandbox: AsyncSandbox = await make_sandbox(image=JS_IMAGE, timeout=60)
    await sandbox.run_python("open('note.txt', 'w').write('from python')")
    ctx = await sandbox.create_context(language="typescript")
    assert (ctx.language, ctx.kernel) == ("typescript", "deno")
    read = await sandbox.run_code("Deno.readTextFileSync('note.txt')", context=ctx)
    assert read.status == "ok" and "from python" in read.text
    crashed = await sandbox.run_code('Deno.kill(Deno.pid, "SIGKILL")', context=ctx)
    assert crashed.status == "kernel_died" and crashed.state_lost
    assert (await sandbox.run_code("1 + 1", context=ctx)).text == "2"
    await sandbox.remove_context(ctx)
    assert [c.id for c in sandbox.list_contexts()] == ["default"]
    assert (await sandbox.run_python("print('still here')")).stdout == "still here\n"


def test_the_cli_runs_code_of_a_language_in_its_image(docker_engine: Any) -> None:
    _require_image(JS_IMAGE)
    done = CliRunner().invoke(cli, ["run", "--language", "js", "-c", "console.log(6 * 7)"])
    assert done.exit_code == 0, done.output
    assert done.output.strip() == "42"
    failed = CliRunner().invoke(cli, ["run", "-l", "javascript", "-c", "throw new Error('no')"])
    assert failed.exit_code == 1 and "no" in failed.output
