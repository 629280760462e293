"""``stallscope report``: one self-contained HTML file per run.

The page opens with the verdict and the fixes (one card per finding: severity, confidence,
summary, evidence, fixes, estimated speedup), then time-aligned plots (GPU utilisation, data wait
per step, the dataset's disk, CPU of the trainer vs its DataLoader workers, memory and
``/dev/shm``), the run's summary table, unavailable sources and events.

No network: CSS, SVG plots (drawn by matplotlib) and one small script are inline; a
Content-Security-Policy forbids loading anything. Everything that came from the machine is
HTML-escaped. A one-hour run at 1 Hz gives a file of a few hundred kB.

>>> from stallscope.report import write_report
>>> write_report(Path("stallscope-runs/20261121-101500-train.py"))  # doctest: +SKIP
PosixPath('stallscope-runs/20261121-101500-train.py/report.html')
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stallscope.analysis.rundata import RunData, load_run
from stallscope.errors import UsageError
from stallscope.report.page import render_page
from stallscope.report.plots import Plot, build_plots, render_svg

__all__ = ["RunData", "load_run", "render_report", "write_report"]


def render_report(run_dir: Path, diagnosis: dict[str, Any] | None,
                  data: RunData | None = None) -> str:
    """The report of ``run_dir`` as an HTML string, given its ``diagnose --json`` document
    (``None`` when no diagnosis is available: the page says so and shows the rest).
    ``data``: the run, when the caller already loaded it."""
    if data is None:
        data = load_run(Path(run_dir))
    sf = diagnosis.get("stall_fraction") if diagnosis else None
    plots = build_plots(data, sf if isinstance(sf, (int, float)) else None)
    return render_page(data, diagnosis, _draw(plots, data.t1 - data.t0))


def _draw(plots: list[Plot], span: float) -> list[tuple[str, str, str, str | None]]:
    drawable = [p for p in plots if p.panels]
    if drawable:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            note = ("Plots need matplotlib, which is not installed "
                    "(pip install 'stallscope[report]').")
            return [(p.id, p.title, note, None) for p in plots]
    return [(p.id, p.title, p.note, render_svg(p, span) if p.panels else None) for p in plots]


def _diagnose_fn() -> Callable[[Path, RunData], dict[str, Any]] | None:
    """``stallscope.analysis.diagnose.diagnose_run`` when this stallscope has it, else None."""
    try:
        mod = importlib.import_module("stallscope.analysis.diagnose")
    except ImportError as exc:
        if exc.name == "stallscope.analysis.diagnose":
            return None
        raise
    fn = getattr(mod, "diagnose_run", None)
    return fn if callable(fn) else None


def write_report(run_dir: Path, out_path: Path | None = None) -> Path:
    """Diagnose ``run_dir``, render its report and write it to ``out_path`` (default
    ``RUN/report.html``) atomically; returns the path written."""
    run_dir = Path(run_dir)
    out = Path(out_path) if out_path is not None else run_dir / "report.html"
    data = load_run(run_dir)  # read once, for the diagnosis and the page
    diagnose = _diagnose_fn()
    diagnosis = diagnose(run_dir, data) if diagnose is not None else None
    text = render_report(run_dir, diagnosis, data)
    tmp = out.with_name(out.name + ".tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise UsageError(f"cannot write {out}: {exc.strerror or exc}") from exc
    return out
