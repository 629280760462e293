"""The report in a real browser: Debian's headless ``chromium`` renders it, runs its script, and
we check the DOM it ends with, that the page asked for nothing over the network (Chromium's own
net log), and save a screenshot to ``artifacts/report-screenshot.png`` (``STALLSCOPE_ARTIFACTS``
overrides the directory) for CI to keep.

Without chromium the tests fail, unless ``STALLSCOPE_ALLOW_MISSING_TOOLS=1`` (then they skip).
"""

from __future__ import annotations

import html
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT as REPO
from test_report import EVIL, diagnosis, make_run

from stallscope.report import render_report

pytestmark = pytest.mark.chromium

PLOTS = ("gpu", "wait", "disk", "cpu", "mem")


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("STALLSCOPE_ALLOW_MISSING_TOOLS") == "1":
        pytest.skip("chromium is not installed (apt-get install chromium)")
    pytest.fail(
        "chromium is not installed (apt-get install chromium); set "
        "STALLSCOPE_ALLOW_MISSING_TOOLS=1 to skip browser tests"
    )


def _run_chromium(page: Path, tmp: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    profile = tmp / "profile"
    profile.mkdir(exist_ok=True)
    argv = [
        _chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        *extra,
        page.as_uri(),
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def _page_requests(netlog: Path) -> list[str]:
    """URLs the page itself (a file:// document) asked the network stack for.

    Chromium's own background requests (update checks) carry no file:// isolation key; a
    request made by the page does."""
    text = netlog.read_text()
    try:
        log: dict[str, Any] = json.loads(text)
    except ValueError:  # a log cut short at exit lacks its closing brackets
        log = json.loads(text.rstrip().rstrip(",") + "]}")
    names = {v: k for k, v in log["constants"]["logEventTypes"].items()}
    urls = []
    for ev in log["events"]:
        params = ev.get("params") or {}
        if names.get(ev["type"]) == "URL_REQUEST_START_JOB" and "file://" in str(
            params.get("network_isolation_key", "")
        ):
            url = str(params.get("url", ""))
            if not url.startswith(("file:", "data:")):
                urls.append(url)
    return urls


@pytest.fixture(scope="module")
def report_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("browser")
    run = make_run(root, duration_s=900, steps=900, evil=True)
    page = root / "report.html"
    page.write_text(render_report(run, diagnosis(run, evil=True)), encoding="utf-8")
    return page


def test_dom_after_scripts_has_verdict_and_plots(report_page: Path, tmp_path: Path) -> None:
    netlog = tmp_path / "netlog.json"
    dom = _run_chromium(report_page, tmp_path, f"--log-net-log={netlog}", "--dump-dom").stdout
    assert 'data-ready="1"' in dom, "the page's script did not run to its end"
    assert "Input-bound: storage cannot feed the trainer fast enough" in dom
    assert 'id="verdict-kind">input_bound.fetch<' in dom
    for pid in PLOTS:
        assert f'id="svg-{pid}"' in dom, pid
    assert dom.count('class="finding ') >= 3
    # machine text stayed text in the browser: no element was made from it
    assert "<img" not in dom
    assert dom.count("<script") == 1
    assert html.escape(EVIL, quote=False) in dom
    assert _page_requests(netlog) == []


def test_netlog_check_catches_a_page_that_loads(tmp_path: Path) -> None:
    """The no-network check above can fail: a page with remote assets is caught."""
    page = tmp_path / "remote.html"
    page.write_text(
        '<!DOCTYPE html><img src="http://127.0.0.1:9/x.png">'
        '<script src="https://example.invalid/x.js"></script>'
    )
    netlog = tmp_path / "netlog.json"
    _run_chromium(page, tmp_path, f"--log-net-log={netlog}", "--dump-dom")
    assert sorted(_page_requests(netlog)) == [
        "http://127.0.0.1:9/x.png",
        "https://example.invalid/x.js",
    ]


def test_screenshot(report_page: Path, tmp_path: Path) -> None:
    out_dir = Path(os.environ.get("STALLSCOPE_ARTIFACTS") or REPO / "artifacts")
    out_dir.mkdir(parents=True, exist_ok=True)
    shot = out_dir / "report-screenshot.png"
    shot.unlink(missing_ok=True)
    _run_chromium(report_page, tmp_path, f"--screenshot={shot}", "--window-size=1280,2000")
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1280, 2000)
    assert len(data) > 50_000, "a blank page compresses to a few kB"
