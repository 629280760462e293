"""Every surface of one run, parsed and held together (issue 49): :func:`check_one_set`, used by
tests/integration/test_one_set_of_numbers.py (recorded H200 runs) and
tests/scenarios/test_one_set_of_numbers_live.py (a real training). A new surface joins here."""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

from conftest import stallscope_argv

from stallscope.units import pct, speedup, throughput


def cli(*args: str, cwd: Path | None = None) -> str:
    r = subprocess.run(
        stallscope_argv(*args),
        capture_output=True,
        text=True,
        timeout=180,
        cwd=cwd,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert r.returncode == 0, (args, r.stderr[-2000:])
    return r.stdout


def _one(pattern: str, text: str, what: str) -> str:
    found = re.findall(pattern, text)
    assert found, f"{what}: /{pattern}/ not in:\n{text[-3000:]}"
    assert len(set(found)) == 1, f"{what}: several values {found}"
    return str(found[0])


def check_one_set(run: Path, tmp: Path, run_stderr: str | None = None) -> dict[str, Any]:
    """Every surface of ``run`` (a run folder under ``tmp``), parsed and held together;
    ``run_stderr``: what `stallscope run` printed at its end, when the run was made here."""
    shown = json.loads(cli("show", str(run), "--json"))
    doc = json.loads(cli("diagnose", str(run), "--json"))
    show_text = cli("show", str(run))
    diag_text = cli("diagnose", str(run))
    report = tmp / "report.html"
    cli("report", str(run), "-o", str(report))
    raw_page = report.read_text()
    page = html.unescape(re.sub(r"<[^>]+>", "", raw_page))  # its text, as a reader sees it
    [listed] = [
        r
        for r in json.loads(cli("runs", "--json", "--here", "--out", str(run.parent)))
        if Path(r["path"]).resolve() == run.resolve()
    ]
    cmp = json.loads(cli("compare", str(run), str(run), "--json"))
    cmp_text = cli("compare", str(run), str(run))
    sig, summary = doc["signals"], shown["summary"]
    top = doc["findings"][0]
    texts = {"show": show_text, "report": page}
    if run_stderr is not None:
        texts["run"] = run_stderr

    # the verdict
    verdict = doc["verdict"]
    assert listed["verdict"] == cmp["verdict_a"] == verdict
    for name, text in {**texts, "diagnose": diag_text}.items():
        if name == "report":
            assert f'<code id="verdict-kind">{verdict}</code>' in raw_page
        else:
            assert _one(r"verdict: (\S+)", text, name) == verdict
    # the throughput: the same number, written by one function
    rate = sig.get("samples_per_s")
    assert summary.get("samples_per_s") == rate
    rows = {r["key"]: r for r in cmp["rows"]}
    if rate is not None:
        assert rows["samples_per_s"]["a"] == rate
        for name, text in texts.items():
            assert f"throughput: {throughput(rate)}" in text or (
                name == "report" and throughput(rate) in text
            ), (name, throughput(rate))
        assert throughput(rate).removesuffix(" samples/s") in cmp_text
    # the data-wait share
    stall = doc["stall_fraction"]
    if stall is not None:
        assert sig["stall_fraction"] == stall == rows["stall_fraction"]["a"]
        assert pct(stall) in cmp_text
    # the trainer's CPU: compare's mean is the report's process row, for one trainer
    mains = [p for p in sig.get("processes", []) if p["role"] == "main"]
    if len(mains) == 1 and sig.get("main_cpu_pct") is not None:
        assert rows["main_cpu_pct"]["a"] == sig["main_cpu_pct"] == mains[0]["cpu_mean_pct"]
    # speed-ups
    if top["est_speedup"] > 1.01:
        shown_speedup = speedup(top["est_speedup"])
        for name, text in {**texts, "diagnose": diag_text}.items():
            assert f"up to {shown_speedup}" in text, (name, shown_speedup)
    assert cmp["speedup"] == 1.0 if rate else "speedup" not in cmp
    # the exit code and the duration
    code = sig.get("exit_code")
    assert listed["exit_code"] == summary.get("exit_code") == code
    if code is not None:
        for name, text in texts.items():
            assert _one(r"exit code (-?\d+)", text, name) == str(code)
    assert listed["duration_s"] == shown["duration_s"] == sig["duration_s"]
    assert _one(r" · (\d+) s · ", show_text, "show") == f"{sig['duration_s']:.0f}"
    assert f"({sig['duration_s']:,.0f} s)" in page
    return doc
