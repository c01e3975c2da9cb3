"""The live session page in a real browser (Debian's chromium + chromedriver, selenium).

A real ``kernel-sandbox serve`` process, a sandbox made and driven through the API
(RemoteSandbox), and a headless Chromium on ``/ui``: the list shows the sandbox with
its owner, image and state; the session page grows when a cell runs through the API,
shows a matplotlib plot, interrupts a running cell, and offers the downloads.  The
The docs' screenshot ``docs/live-page.png`` is made anew with
``KERNEL_SANDBOX_SCREENSHOT=docs/live-page.png`` (otherwise the shot goes to a
temporary file: tests leave the checkout as it was).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import nbformat
import pytest

from kernel_sandbox.client.remote import RemoteSandbox
from tests.conftest import require
from tests.integration.serving import KEY_A, KEY_B, Server
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

DATASCIENCE = "kernel-sandbox:datascience"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, docker_engine) -> Iterator[Server]:  # type: ignore[no-untyped-def]
    srv = Server(f"t-live-{os.getpid()}", tmp_path_factory.mktemp("nb")).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    require(shutil.which("chromium") is not None, "chromium missing: apt-get install chromium")
    require(shutil.which("chromedriver") is not None, "chromedriver missing: chromium-driver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        require(False, "selenium missing: pip install selenium")
        raise
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or ""
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1200,1400", "--disable-gpu"):  # fmt: skip
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def _page_text(driver) -> str:  # type: ignore[no-untyped-def]
    return str(driver.execute_script("return document.getElementById('cells').innerText"))


async def test_live_page_follows_the_api(server: Server, browser, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By

    driver = browser
    # the page needs the key: without it, 401
    assert httpx2.get(f"{server.url}/ui/list.json").status_code == 401
    async with await RemoteSandbox.create(server.url, api_key=KEY_A, image=DATASCIENCE) as sb:
        await sb.run_python("x = 41\nprint('first cell', x)")
        await asyncio.to_thread(driver.get, f"{server.url}/ui?api_key={KEY_A}")
        assert "api_key" not in driver.current_url  # moved into the cookie
        row = await asyncio.to_thread(
            wait_for, lambda: driver.find_elements(By.XPATH, f"//a[text()='{sb.id}']")
        )
        table = driver.find_element(By.ID, "live").text
        assert DATASCIENCE in table and "idle" in table
        await asyncio.to_thread(row[0].click)
        await asyncio.to_thread(wait_for, lambda: "first cell 41" in _page_text(driver))

        # a cell run through the API shows on the open page
        started = time.monotonic()
        await sb.run_python("print('hello from the API', x + 1)")
        ran = time.monotonic() - started
        await asyncio.to_thread(wait_for, lambda: "hello from the API 42" in _page_text(driver))
        shown = time.monotonic() - started - ran
        print(f"\ncell shown {shown * 1000:.0f} ms after its API call returned")

        # a running call's streams show before it ends
        ticking = asyncio.ensure_future(
            sb.run_python(
                "import time\nfor i in range(3):\n    print('tick', i, flush=True)"
                "\n    time.sleep(1.5)"
            )
        )
        await asyncio.to_thread(wait_for, lambda: "tick 0" in _page_text(driver))
        assert not ticking.done()
        assert driver.find_elements(By.CSS_SELECTOR, "#cells .cell.running")
        await ticking
        await asyncio.to_thread(
            wait_for, lambda: not driver.find_elements(By.CSS_SELECTOR, "#cells .cell.running")
        )

        # a plot is displayed (a decoded image, not just a tag)
        await sb.run_python(
            "%matplotlib inline\nimport matplotlib.pyplot as plt\n"
            "plt.plot([1, 3, 2, 4]); plt.title('live plot'); plt.show()"
        )
        width = await asyncio.to_thread(
            wait_for,
            lambda: driver.execute_script(
                "const i = document.querySelector('#cells img.plot');"
                "return i && i.complete ? i.naturalWidth : 0"
            ),
        )
        assert width > 100
        await sb.run_shell("echo from the shell > note.txt && cat note.txt")
        await sb.files.write("data.csv", "a,b\n1,2\n")
        try:
            await asyncio.to_thread(wait_for, lambda: "data.csv" in _page_text(driver), 10)
        except AssertionError:
            print(_page_text(driver)[-1500:])
            raise
        driver.execute_script("window.scrollTo(0, 0)")
        shot = os.environ.get("KERNEL_SANDBOX_SCREENSHOT") or str(tmp_path / "live-page.png")
        assert await asyncio.to_thread(driver.save_screenshot, shot)

        # interrupt from the page stops a running cell; the kernel keeps x
        long = asyncio.ensure_future(sb.run_python("import time\ntime.sleep(120)"))
        await asyncio.to_thread(
            wait_for, lambda: "busy" in driver.find_element(By.ID, "state").text, 30
        )
        await asyncio.to_thread(driver.find_element(By.ID, "interrupt").click)
        execution = await asyncio.wait_for(long, 60)
        assert execution.error is not None and execution.error.ename == "KeyboardInterrupt"
        assert (await sb.run_python("print(x)")).stdout == "41\n"

        # downloads: the .ipynb as recorded so far (write-behind flushed), and HTML
        headers = {"X-API-Key": KEY_A}
        got = httpx2.get(f"{server.url}/ui/s/{sb.id}/notebook.ipynb", headers=headers)
        nb = nbformat.reads(got.text, as_version=4)
        nbformat.validate(nb)
        assert any("hello from the API" in json.dumps(c.get("outputs", [])) for c in nb.cells)
        page = httpx2.get(f"{server.url}/ui/s/{sb.id}/notebook.html", headers=headers, timeout=60)
        assert page.status_code == 200 and "hello from the API" in page.text
        # a session page opened directly with ?api_key= keeps the key too
        await asyncio.to_thread(driver.get, f"{server.url}/ui/s/{sb.id}?api_key={KEY_A}")
        assert "api_key" not in driver.current_url
        await asyncio.to_thread(wait_for, lambda: "hello from the API 42" in _page_text(driver))
        # another key sees nothing of it
        other = {"X-API-Key": KEY_B}
        assert httpx2.get(f"{server.url}/ui/s/{sb.id}/cells", headers=other).status_code == 404
        listed = httpx2.get(f"{server.url}/ui/list.json", headers=other).json()
        assert listed["sandboxes"] == []
