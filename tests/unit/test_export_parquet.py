"""``stallscope export --format parquet`` without pyarrow names the extra that brings it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from stallscope.cli.export import _write_parquet
from stallscope.errors import UsageError


def test_parquet_without_pyarrow_names_the_extra(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow raises ImportError
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(UsageError, match=r"pip install 'stallscope\[parquet\]'"):
        _write_parquet(str(tmp_path / "x.parquet"), {"t": "float"}, [(1.0,)])
    assert not (tmp_path / "x.parquet").exists()
