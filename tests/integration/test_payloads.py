"""The typed payloads of the host, procs and disk sources against the metric vocabulary and
against what the sources really read on this machine: a key the vocabulary does not declare
is dropped from the points without a word (numeric_points), so the three must agree."""

from __future__ import annotations

import subprocess
import sys
import time
import typing

from stallscope.metrics import by_source
from stallscope.sources.base import numeric_points
from stallscope.sources.disk import FIELDS, DiskFields, DiskSource
from stallscope.sources.host import HostPayload, HostSource
from stallscope.sources.procs import ProcRecord, ProcsSource

#: keys that are no metric of their own: text and ids, and the list behind host.cpu_core_pct
NOT_METRICS = {"name", "role", "state", "ppid", "cpu_per_core_pct"}


def _numeric(td: type) -> set[str]:
    return set(typing.get_type_hints(td)) - NOT_METRICS


def _declared(source: str) -> set[str]:
    """The vocabulary's gauges and rates a source reads itself (no counters, nothing derived
    by the collector, no per-core entity metric)."""
    return {
        m.key
        for m in by_source(source)
        if m.kind != "counter" and not m.derived and m.key != "cpu_core_pct"
    }


def test_each_payload_type_names_what_the_vocabulary_declares() -> None:
    assert _numeric(HostPayload) == _declared("host")
    assert _numeric(ProcRecord) == _declared("procs")
    assert _numeric(DiskFields) == _declared("disk") and tuple(DiskFields.__annotations__) == FIELDS


def test_real_readings_hold_only_typed_keys_and_every_number_becomes_a_point() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        host, procs, disk = HostSource(), ProcsSource(child.pid), DiskSource()
        for src in (host, procs, disk):
            src.open()
            src.sample(time.time())
        time.sleep(0.3)
        h, p, d = host.sample(time.time()), procs.sample(time.time()), disk.sample(time.time())
        assert h and p is not None and d is not None
        assert set(h) <= set(typing.get_type_hints(HostPayload))
        assert set(h) >= _declared("host") - {"shm_total_mib", "shm_used_mib"} - {
            k for k in _declared("host") if k.startswith("psi_")
        }  # where the machine tells
        names = {pt.name for pt in numeric_points("host", "", h)}
        assert names == {
            f"host.{k}" for k, v in h.items() if k not in NOT_METRICS and v is not None
        }
        rec = p[str(child.pid)]
        assert set(rec) <= set(typing.get_type_hints(ProcRecord)) and "cpu_pct" in rec
        assert {pt.name for pt in numeric_points("procs", "x", rec)} == {
            f"procs.{k}" for k in rec if k not in NOT_METRICS
        }
        for fields in d.values():
            assert list(fields) == list(FIELDS)
        for src in (host, procs, disk):
            src.close()
    finally:
        child.kill()
        child.wait()
