"""``stallscope export --format parquet``: ``time`` a UTC timestamp, read back by pyarrow; without
pyarrow, the extra that brings it named."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from stallscope.cli.export import _write_parquet
from stallscope.errors import UsageError


def test_parquet_without_pyarrow_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow raises ImportError
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(UsageError, match=r"pip install 'stallscope\[parquet\]'"):
        _write_parquet(str(tmp_path / "x.parquet"), {"t": "float"}, [(1.0,)])
    assert not (tmp_path / "x.parquet").exists()


START = 1_700_000_000.0


@pytest.fixture
def away_from_utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Local time 5 h 30 ahead of UTC (the CI machine's is UTC, where a local time written as
    UTC would pass unseen)."""
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def _run(tmp_path: Path) -> Path:
    from stallscope.metrics import Point
    from stallscope.store import RunStore, StepRow, write_meta

    run = tmp_path / "20231114-221320-train"
    run.mkdir()
    write_meta(
        run,
        {
            "command": ["python", "train.py"],
            "start": START,
            "end": START + 3,
            "exit_code": 0,
            "interval_s": 1.0,
            "monitor_pid": 1,
        },
    )
    st = RunStore(run / "run.db")
    for k in range(3):
        st.add_points(START + 0.25 + k, [Point("host.cpu_pct", "", 10.0 + k)])
    st.add_steps(
        [StepRow(0, i, START + 1 + i / 3, 0.3, 0.1, None, 0.25, None, 32, 0) for i in range(3)]
    )
    st.finish()
    st.close()
    return run


@pytest.mark.usefixtures("away_from_utc")
@pytest.mark.parametrize(
    "what, instants",
    [
        ("points", [START + 0.25, START + 1.25, START + 2.25]),
        ("steps", [START + 1, START + 1 + 1 / 3, START + 1 + 2 / 3]),
    ],
)
def test_parquet_time_is_a_utc_timestamp(tmp_path: Path, what: str, instants: list[float]) -> None:
    """``time`` was text in Parquet (the CSV's ISO string): a reader had to parse it to plot or
    join. It is a timestamp, milliseconds, UTC, holding each sample's instant; the CSV keeps its
    local ISO 8601 text of the same instant."""
    import pyarrow as pa  # the parquet extra: scripts/setup.sh installs it, a missing one fails
    import pyarrow.parquet as pq

    from stallscope.analysis.rundata import load_run
    from stallscope.cli.export import _cell, table

    columns, rows = table(load_run(_run(tmp_path)), what)
    out = tmp_path / f"{what}.parquet"
    _write_parquet(str(out), columns, rows)
    got = pq.read_table(out)
    assert got.schema.field("time").type == pa.timestamp("ms", tz="UTC")
    times = got.column("time").to_pylist()
    assert all(t.utcoffset() == timedelta(0) for t in times), times
    # each instant to the millisecond (the step at START + 4/3 s: .333)
    assert [t.timestamp() for t in times] == pytest.approx(
        [int(x * 1000) / 1000 for x in instants], abs=1e-9
    )
    assert times[0] == datetime.fromtimestamp(instants[0], tz=timezone.utc)
    # the CSV's cell: local time with its offset, the same instant
    text = _cell(rows[0][list(columns).index("time")])
    assert text.endswith("+05:30") and datetime.fromisoformat(text) == times[0], text
