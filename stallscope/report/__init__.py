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

import contextlib
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from stallscope.analysis.diagnose import diagnose_run
from stallscope.analysis.rundata import RunData, load_run
from stallscope.errors import UsageError
from stallscope.report.page import render_page
from stallscope.report.plots import Plot, build_plots, render_svg

__all__ = ["RunData", "load_run", "render_report", "write_report"]


def render_report(
    run_dir: Path, diagnosis: dict[str, Any] | None, data: RunData | None = None
) -> str:
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
            note = (
                "Plots need matplotlib, which is not installed (pip install 'stallscope[report]')."
            )
            return [(p.id, p.title, note, None) for p in plots]
    return [(p.id, p.title, p.note, render_svg(p, span) if p.panels else None) for p in plots]


def write_report(run_dir: Path, out_path: Path | None = None) -> Path:
    """Diagnose ``run_dir``, render its report and write it to ``out_path`` (default
    ``RUN/report.html``) atomically; returns the path written.

    ``out_path`` may be a new or a regular file (replaced), a symlink (its target is written,
    the link stays, as with ``cp`` or a shell's ``>``) or a directory (``DIR/report.html``).
    Anything else (a device such as ``/dev/full``, a FIFO, a socket) is refused: it is never
    replaced by a file. The text goes to a temporary file in the target's own directory, then
    is renamed over the target; when that fails (a full disk) nothing half-written is left."""
    run_dir = Path(run_dir)
    out = Path(out_path) if out_path is not None else run_dir / "report.html"
    out, target = resolve_output(out, "report.html")
    data = load_run(run_dir)  # read once, for the diagnosis and the page
    text = render_report(run_dir, diagnose_run(run_dir, data), data)
    try:
        write_atomic(target, text.encode("utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot write {out}: {exc.strerror or exc}") from exc
    return out


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def resolve_output(out: Path, default_name: str) -> tuple[Path, Path]:
    """-> (the path to name to the user, the regular file to write). Follows symlinks; a
    directory gets ``default_name`` inside it; anything but a regular file is refused."""
    for _ in range(2):  # DIR -> DIR/default_name, checked once more
        try:
            st = os.stat(out)  # follows symlinks
        except FileNotFoundError:
            break  # new file (or a dangling link: its target is created, as `>` does)
        except OSError as exc:
            raise UsageError(f"cannot write {out}: {exc.strerror or exc}") from exc
        if stat.S_ISDIR(st.st_mode):
            out = out / default_name
            continue
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(
                f"cannot write {out}: {_kind(st.st_mode)}, not a regular file; "
                "give the path of a file"
            )
        break
    return out, Path(os.path.realpath(out))


def write_atomic(target: Path, data: bytes) -> None:
    """Write ``data`` to ``target`` through a temporary file in its directory and a rename;
    an existing file keeps its permissions. On any error the temporary file is removed and
    ``target`` is untouched."""
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
