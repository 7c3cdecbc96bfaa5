"""A real browser on the widgets (issue 16): JupyterLab (with jupyterlab_widgets) in headless
Chromium driven by Playwright, the Debian `chromium` package as the browser. A notebook with an
IntSlider whose observer prints the square into an Output widget is run on the zeroboot kernel;
the test moves the slider with the keyboard and waits for the printed square, then takes a
screenshot.

Skipped, saying why, when chromium, Playwright or JupyterLab is missing
(`apt-get install chromium`; `pip install jupyterlab playwright`).
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from kernel_helpers import ensure_kernelspecs

pytestmark = pytest.mark.kvm

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
TOKEN = "zeroboot-browser-test"
CELL = """\
import ipywidgets as w
s = w.IntSlider(value=3, description='n')
out = w.Output()
def show(change):
    with out:
        out.clear_output()
        print('square', change['new'] ** 2)
s.observe(show, names='value')
display(s, out)
"""


def _missing() -> str | None:
    if CHROMIUM is None:
        return "no chromium on PATH (Debian: apt-get install chromium)"
    for module in ("playwright.sync_api", "jupyterlab", "jupyterlab_widgets"):
        try:
            __import__(module)
        except ImportError:
            return f"{module} is not installed (pip install jupyterlab playwright ipywidgets)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    why = _missing()
    if why:
        pytest.skip(why)
    ensure_kernelspecs()  # JUPYTER_PATH and XDG_CACHE_HOME of this process, which the server inherits
    root = tmp_path_factory.mktemp("lab")
    notebook = {"cells": [{"cell_type": "code", "execution_count": None, "id": "slider", "metadata": {},
                           "outputs": [], "source": CELL}],
                "metadata": {"kernelspec": {"name": "zeroboot", "display_name": "zeroboot", "language": "python"}},
                "nbformat": 4, "nbformat_minor": 5}
    (root / "widgets.ipynb").write_text(json.dumps(notebook))
    port = _free_port()
    home = root / "home"
    home.mkdir()
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(home / "config"), "JUPYTER_RUNTIME_DIR": str(home / "runtime")}
    server = subprocess.Popen([sys.executable, "-m", "jupyterlab", "--no-browser", f"--ServerApp.port={port}",
                               f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={root}",
                               "--ServerApp.ip=127.0.0.1", "--LabApp.news_url=", "--LabApp.check_for_updates_class="
                               "jupyterlab.NeverCheckForUpdate", *(["--allow-root"] if os.geteuid() == 0 else [])],
                              env=env, cwd=root, stdout=subprocess.DEVNULL, stderr=open(root / "lab.log", "wb"))
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={TOKEN}", timeout=5).read()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("JupyterLab did not start:\n" + (root / "lab.log").read_text()[-3000:])
                time.sleep(0.5)
        yield base
    finally:
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def test_a_slider_moved_in_the_browser_runs_its_observer_in_the_sandbox(lab: str, tmp_path: Path) -> None:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 800})
            page.set_default_timeout(120_000)
            page.goto(f"{lab}/lab/tree/widgets.ipynb?token={TOKEN}")
            page.wait_for_selector(".jp-Notebook .jp-Cell .jp-InputArea")
            # the kernel is up when the status shows idle; then run the cell
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']")
            page.wait_for_selector(".jp-StatusBar-TextItem:text-matches('zeroboot.*Idle')")
            page.click(".jp-Notebook .jp-Cell .jp-InputArea-editor")
            for _ in range(10):  # the session may still be connecting: run again until the cell runs
                page.keyboard.press("Control+Enter")
                try:
                    page.wait_for_selector(".jp-Cell .jp-InputPrompt:text-matches('\\[[0-9*]\\]')", timeout=5_000)
                    break
                except PlaywrightTimeout:
                    continue
            try:
                handle = page.wait_for_selector(".widget-slider .noUi-handle")
            except PlaywrightTimeout:
                page.screenshot(path=str(tmp_path / "failed.png"))
                raise AssertionError("no slider on the page; it shows:\n" + page.inner_text(".jp-Notebook")[-2000:]
                                     + f"\n(screenshot {tmp_path / 'failed.png'})") from None
            page.wait_for_selector(".widget-readout:text-is('3')")
            assert handle is not None
            handle.focus()
            page.keyboard.press("ArrowRight")  # 3 -> 4
            page.wait_for_selector(".widget-output :text('square 16')")
            shot = tmp_path / "slider.png"
            page.screenshot(path=str(shot))
            assert shot.stat().st_size > 10_000
        finally:
            browser.close()
