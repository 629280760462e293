"""Corrupted run stores: every reading command gives one line, or reads around the bad rows.

A corpus of damaged run directories is built from one pristine run (made by `stallscope run`,
with probe steps and a probe row added through the store), copied once per case and damaged in
one way each: wrong values and types in run.db rows, broken entity attributes, a damaged or
foreign run.db file, a hostile meta.json. Every reading command runs on every case through the
real CLI; none may print a traceback, and where rows were skipped the rest is still read.

``PYTHONPATH=tests python tests/scenarios/test_corrupt_runs.py`` (from the repository; tests/
holds the conftest it imports) prints the cases per category and how many tracebacked.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import shutil
import signal
import sqlite3
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import TESTS_DIR, stallscope_argv

pytestmark = pytest.mark.slow

#: every reading command, as argv after `stallscope` ({run}, {out}, {tmp} filled per case)
COMMANDS: dict[str, list[str]] = {
    "show": ["show", "{run}"],
    "show --json": ["show", "{run}", "--json"],
    "diagnose --json": ["diagnose", "{run}", "--json"],
    "report": ["report", "{run}", "-o", "{tmp}/report.html"],
    "export csv": ["export", "{run}", "--format", "csv"],
    "runs": ["runs", "--out", "{out}"],
}

#: how many bad rows a row-level case adds (all readers must skip exactly these)
BAD = 3


@dataclass(frozen=True)
class Case:
    category: str
    damage: Callable[[Path], None]
    #: the damage only adds BAD unreadable rows: every pristine point is still exported and
    #: `show` says rows were skipped
    rows_skipped: bool = False


# --- damage helpers ----------------------------------------------------------------------------
def _sql(*stmts: str) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        db = sqlite3.connect(run / "run.db")
        for s in stmts:
            db.execute(s)
        db.commit()
        db.close()

    return damage


def _loosen(table: str, *stmts: str) -> Callable[[Path], None]:
    """Rebuild ``table`` without NOT NULL constraints (a foreign writer's), then run stmts."""
    return _sql(
        f"CREATE TABLE _t AS SELECT * FROM {table}",
        f"DROP TABLE {table}",
        f"ALTER TABLE _t RENAME TO {table}",
        *stmts,
    )


def _bad_points(
    v: str = "1.0", ts: str = "t.ts + 0.001 * k.k", series: str = "t.series"
) -> Callable[[Path], None]:
    """BAD extra rows of ``points`` (the layout of schema version 6 and before, still read: after
    the first sample, in an existing series unless told)."""
    return _sql(
        "CREATE TEMP TABLE k(k INTEGER)",
        "INSERT INTO k VALUES(1),(2),(3)",
        f"INSERT INTO points SELECT {ts}, {series}, {v} FROM "
        "(SELECT ts, (SELECT MIN(id) FROM series) AS series FROM samples ORDER BY ts LIMIT 1) t, k",
    )


def _bad_samples(
    data: Callable[[int, bytes, int], object],
    ts: Callable[[int, float], object] = lambda k, t: t + 0.001 * k,
    loosen: bool = False,
) -> Callable[[Path], None]:
    """BAD extra rows of ``samples`` (schema version 7), ``k`` = 1 to 3: at ``ts(k, first
    sample's time)``, holding ``data(k, first sample's blob, first series id)`` (``loosen``: the
    table rebuilt without its constraints first)."""

    def damage(run: Path) -> None:
        if loosen:
            _loosen("samples")(run)
        db = sqlite3.connect(run / "run.db")
        t, blob = db.execute("SELECT ts, data FROM samples ORDER BY ts LIMIT 1").fetchone()
        [[sid]] = db.execute("SELECT MIN(id) FROM series").fetchall()
        db.executemany(
            "INSERT INTO samples VALUES(?, ?)", [(ts(k, t), data(k, blob, sid)) for k in (1, 2, 3)]
        )
        db.commit()
        db.close()

    return damage


def _blob(values: dict[int, float]) -> bytes:
    from stallscope.store.samples import Packer

    return Packer().pack(values)


def _recount(blob: bytes, k: int) -> bytes:
    """``blob`` saying ``k`` more points than its runs of ids hold, with their values (its length
    agrees with its count)."""
    (count,) = struct.unpack_from("<I", blob, 5)
    return blob[:5] + struct.pack("<I", count + k) + blob[9:] + struct.pack(f"<{k}d", *[1.0] * k)


def _bad_rollup(v: str) -> Callable[[Path], None]:
    """Buckets whose value (``rollup.v``, schema version 5) is ``v``."""
    return _sql(
        "INSERT INTO rollup SELECT 0.5 * k, (SELECT MIN(id) FROM series), 1, "
        f"{v} FROM (SELECT 1 k UNION SELECT 2 UNION SELECT 3)"
    )


def _procs_attrs(attrs: str) -> Callable[[Path], None]:
    """Replace the attributes of BAD entities (the procs one first) with ``attrs`` (SQL)."""
    return _sql(
        f"UPDATE entities SET attrs={attrs} WHERE rowid IN (SELECT rowid FROM entities "
        "ORDER BY source='procs' DESC LIMIT 3)"
    )


def _bad_steps(col: str, value: str) -> Callable[[Path], None]:
    cols = [
        "rank",
        "step",
        "ts",
        "wait_s",
        "host_s",
        "h2d_s",
        "gpu_busy_s",
        "gpu_idle_s",
        "samples",
        "epoch",
        "comm_s",
        "n",
    ]
    sel = ", ".join(value if c == col else ("100 + k" if c == "step" else c) for c in cols)
    return _sql(
        f"INSERT INTO steps SELECT {sel} FROM (SELECT * FROM steps LIMIT 1), "
        "(SELECT 1 k UNION SELECT 2 UNION SELECT 3)"
    )


def _drop_column(table: str, keep: str) -> Callable[[Path], None]:
    return _sql(
        f"CREATE TABLE _t AS SELECT {keep} FROM {table}",
        f"DROP TABLE {table}",
        f"ALTER TABLE _t RENAME TO {table}",
    )


def _db_bytes(fn: Callable[[bytes], bytes]) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        p = run / "run.db"
        p.write_bytes(fn(p.read_bytes()))

    return damage


def _scramble(b: bytes) -> bytes:
    """Overwrite every page but the first with a pattern (the header stays valid)."""
    return b[:4096] + bytes((i * 7 + 3) % 251 for i in range(len(b) - 4096))


def _db_dir(run: Path) -> None:
    (run / "run.db").unlink()
    (run / "run.db").mkdir()


def _meta_text(text: str | bytes) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        p = run / "meta.json"
        p.write_bytes(text if isinstance(text, bytes) else text.encode())

    return damage


def _meta(**changes: object) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        p = run / "meta.json"
        meta = json.loads(p.read_text())
        meta.update(changes)
        p.write_text(json.dumps(meta))

    return damage


def _unlink(name: str) -> Callable[[Path], None]:
    return lambda run: (run / name).unlink()


CASES: dict[str, Case] = {
    # values in points and rollup
    "point_inf": Case(
        "values", _bad_points(v="CASE k.k WHEN 2 THEN -9e999 ELSE 9e999 END"), rows_skipped=True
    ),
    "point_text": Case(
        "wrong type",
        _bad_points(v="CASE k.k WHEN 2 THEN X'00ff' ELSE 'abc' END"),
        rows_skipped=True,
    ),
    "point_null": Case(
        "NULLs", lambda r: (_loosen("points")(r), _bad_points(v="NULL")(r)), rows_skipped=True
    ),
    "point_ts_text": Case("wrong type", _bad_points(ts="'yesterday' || k.k"), rows_skipped=True),
    "point_ts_inf": Case(
        "values",
        _bad_points(
            ts="CASE k.k WHEN 2 THEN -9e999 ELSE 9e999 END",
            series="CASE k.k WHEN 3 THEN (SELECT MAX(id) FROM series) ELSE t.series END",
        ),
        rows_skipped=True,
    ),
    "point_ts_null": Case(
        "NULLs", lambda r: (_loosen("points")(r), _bad_points(ts="NULL")(r)), rows_skipped=True
    ),
    "point_series_dangling": Case(
        "wrong type", _bad_points(series="99990 + k.k"), rows_skipped=True
    ),
    "point_series_text": Case("wrong type", _bad_points(series="'gpu' || k.k"), rows_skipped=True),
    "point_huge": Case("values", _bad_points(v="1e308")),
    # samples (schema version 7): blobs that cannot be read, and sound ones of no known series
    "sample_truncated": Case(
        "wrong type", _bad_samples(lambda k, b, _: b[: -k * 3]), rows_skipped=True
    ),
    "sample_garbage": Case(
        "wrong type",
        _bad_samples(lambda k, b, _: bytes((i * 7 + k * 31) % 251 for i in range(len(b)))),
        rows_skipped=True,
    ),
    "sample_wrong_count": Case(
        "values", _bad_samples(lambda k, b, _: _recount(b, k)), rows_skipped=True
    ),
    "sample_unknown_series": Case(
        "wrong type", _bad_samples(lambda k, b, _: _blob({99990 + k: 1.0})), rows_skipped=True
    ),
    "sample_value_inf": Case(
        "values",
        _bad_samples(lambda k, b, sid: _blob({sid: (math.inf, -math.inf, math.nan)[k - 1]})),
        rows_skipped=True,
    ),
    "sample_text": Case(
        "wrong type",
        _bad_samples(lambda k, b, _: ("abc", 1.5, b.hex())[k - 1]),
        rows_skipped=True,
    ),
    "sample_null": Case(
        "NULLs", _bad_samples(lambda k, b, _: None, loosen=True), rows_skipped=True
    ),
    "sample_ts_text": Case(
        "wrong type", _bad_samples(lambda k, b, _: b, ts=lambda k, t: f"noon{k}"), rows_skipped=True
    ),
    "sample_ts_inf": Case(
        "values",
        _bad_samples(
            lambda k, b, _: b, ts=lambda k, t: (math.inf, -math.inf, None)[k - 1], loosen=True
        ),
        rows_skipped=True,
    ),
    "point_ts_far_future": Case("values", _bad_points(ts="1e14 + k.k")),
    "rollup_text": Case("wrong type", _bad_rollup("'abc'"), rows_skipped=True),
    "rollup_inf": Case("values", _bad_rollup("9e999"), rows_skipped=True),
    # packed buckets (schema version 6) that cannot be read: damaged, text, and a sound pack
    # (one bucket at -10800) of no known series
    "rollup_pack_damaged": Case(
        "wrong type",
        _sql(
            "INSERT INTO rollup_packs SELECT -3600 * k, CASE k WHEN 3 THEN 99999 ELSE "
            "(SELECT MIN(id) FROM series) END, CASE k WHEN 1 THEN X'01789c' WHEN 2 THEN 'abc' "
            "ELSE X'01789c636480013f079fff10c0c8c80811fa600f007c1c0907' END "
            "FROM (SELECT 1 k UNION SELECT 2 UNION SELECT 3)"
        ),
        rows_skipped=True,
    ),
    "series_null_name": Case(
        "NULLs",
        _loosen(
            "series",
            "INSERT INTO series VALUES(99991, NULL, NULL)",
            "INSERT INTO points SELECT DISTINCT ts + 0.001, 99991, 1.0 FROM samples LIMIT 3",
        ),
    ),
    # entities
    "attrs_bad_json": Case("entities", _procs_attrs("'{not json'")),
    "attrs_json_list": Case("entities", _procs_attrs("'[1, 2]'")),
    "attrs_deep": Case("entities", _procs_attrs(f"'{'[' * 100_000}{']' * 100_000}'")),
    "attrs_sql_null": Case("NULLs", lambda r: (_loosen("entities")(r), _procs_attrs("NULL")(r))),
    "attrs_wrong_types": Case(
        "entities", _procs_attrs("""'{"name": ["x"], "ppid": {"a": 1}, "role": 5, "cmdline": 7}'""")
    ),
    "entity_blob": Case(
        "entities", _sql("UPDATE entities SET entity=X'00ff', first_ts='x' WHERE source='procs'")
    ),
    # events
    "event_null": Case(
        "NULLs", _loosen("events", "INSERT INTO events VALUES(1.0, NULL, 'note', NULL)")
    ),
    "event_blob": Case("wrong type", _sql("INSERT INTO events VALUES(X'00', X'01', X'02', X'03')")),
    "event_ts_text": Case(
        "wrong type", _sql("INSERT INTO events VALUES('noon', 'gpu', 'note', 'x')")
    ),
    # steps and probes
    "step_text": Case("wrong type", _bad_steps("wait_s", "'slow'")),
    "step_inf": Case("values", _bad_steps("host_s", "9e999")),
    "step_h2d_text": Case("wrong type", _bad_steps("h2d_s", "'fast'")),
    "step_rank_text": Case("wrong type", _bad_steps("rank", "'zero' || k")),
    "step_n_text": Case("wrong type", _bad_steps("n", "'two'")),
    "step_n_zero": Case("values", _bad_steps("n", "0")),
    "step_n_negative": Case("values", _bad_steps("n", "-3")),
    "step_null": Case("NULLs", lambda r: (_loosen("steps")(r), _bad_steps("wait_s", "NULL")(r))),
    "probe_pid_huge": Case("wrong type", _sql("UPDATE probes SET pid=1099511627776, config='[1]'")),
    "probe_pid_text": Case("wrong type", _sql("UPDATE probes SET pid='abc', steps='many'")),
    # the run.db file
    "db_zero_bytes": Case("run.db file", _db_bytes(lambda b: b"")),
    "db_truncated": Case("run.db file", _db_bytes(lambda b: b[: len(b) // 2])),
    "db_not_sqlite": Case("run.db file", _db_bytes(lambda b: b"not a database\n" * 300)),
    "db_scrambled": Case("run.db file", _db_bytes(_scramble)),
    "db_missing": Case("run.db file", _unlink("run.db")),
    "db_is_directory": Case("run.db file", _db_dir),
    "table_missing_points": Case("schema", _sql("DROP TABLE points")),
    "table_missing_samples": Case("schema", _sql("DROP TABLE samples")),
    "table_missing_steps": Case("schema", _sql("DROP TABLE steps")),
    "table_missing_entities": Case("schema", _sql("DROP TABLE entities")),
    "column_missing_steps": Case(
        "schema",
        _drop_column("steps", "rank, step, ts, wait_s, host_s, h2d_s, gpu_busy_s, samples, epoch"),
    ),
    "column_missing_attrs": Case(
        "schema", _drop_column("entities", "source, entity, first_ts, last_ts")
    ),
    # meta.json
    "meta_deep": Case("meta.json", _meta_text('{"a": ' * 200_000 + "1" + "}" * 200_000)),
    "meta_monitor_pid_2_40": Case("meta.json", _meta(monitor_pid=2**40, end=None)),
    "meta_monitor_pid_negative": Case("meta.json", _meta(monitor_pid=-1, end=None)),
    "meta_not_object": Case("meta.json", _meta_text("[1, 2, 3]")),
    "meta_not_utf8": Case("meta.json", _meta_text(b'{"start": "\xff\xfe"}')),
    "meta_empty": Case("meta.json", _meta_text("")),
    "meta_missing": Case("meta.json", _unlink("meta.json")),
    "meta_start_far": Case("meta.json", _meta(start=1e14)),
    "meta_wrong_facts": Case(
        "meta.json",
        _meta(
            samples="many",
            loader_config="x",
            dataset_bytes="big",
            interval_s=0,
            disk_health=[{"device": 5, "verdict": ["x"], "reasons": 3}],
            exit_code=10**30,
        ),
    ),
}


# --- the pristine run and the corpus -----------------------------------------------------------
def _pristine(root: Path) -> Path:
    r = subprocess.run(
        stallscope_argv("run", "--interval", "0.2", "--quiet", "--", "sleep", "1"),
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    [run] = list((root / "stallscope-runs").iterdir())
    from stallscope.store import RunStore, StepRow

    st = RunStore(run / "run.db")
    [[t0]] = st.db.execute("SELECT MIN(ts) FROM samples").fetchall()
    st.add_steps(
        StepRow(0, i, t0 + i * 0.1, 0.05, 0.04, 0.001, 0.03, 0.01, 32, 0) for i in range(8)
    )
    st.set_probe(0, os.getpid(), {"batch_size": 32, "num_workers": 2}, 8, 0)
    st.finish()
    st.close()
    return run


@dataclass
class Result:
    rc: int
    stdout: str
    stderr: str


def _env(base: Path) -> dict[str, str]:
    """The CLI's environment: bytecode cached (under ``base``) even where the caller turned it
    off, which halves the start of each of the corpus's few hundred commands."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(base / "pycache")
    return env


def _damaged(base: Path, pristine: Path, name: str, case: Case) -> list[tuple[str, str, list[str]]]:
    """A copy of the pristine run, damaged; the jobs of tests/cli_batch.py that run every
    command of :data:`COMMANDS` on it, labelled ``name\tcommand``."""
    out = base / name / "stallscope-runs"
    run = out / pristine.name
    shutil.copytree(pristine, run)
    case.damage(run)
    return [
        (
            f"{name}\t{label}",
            str(base / name),
            [a.format(run=run, out=out, tmp=base / name) for a in argv],
        )
        for label, argv in COMMANDS.items()
    ]


def _run_batch(base: Path, i: int, jobs: list[tuple[str, str, list[str]]]) -> dict[str, Result]:
    """Run ``jobs`` in one interpreter (tests/cli_batch.py: each command with its own stdout,
    stderr and exit code, an escaped exception printed as a traceback)."""
    jobs_file, results_file = base / f"jobs-{i}.json", base / f"results-{i}.json"
    jobs_file.write_text(json.dumps(jobs))
    r = subprocess.run(
        [sys.executable, str(TESTS_DIR / "cli_batch.py"), str(jobs_file), str(results_file)],
        cwd=base,
        capture_output=True,
        text=True,
        timeout=60 * len(jobs),
        errors="replace",
        env=_env(base),
    )
    done = json.loads(results_file.read_text()) if results_file.exists() else {}
    results = {}
    for label, _cwd, _argv in jobs:
        if label not in done:  # the batch died in this command: what the interpreter said
            results[label] = Result(
                r.returncode or 1,
                "",
                f"batch died ({r.returncode}) in {label}:\n{r.stderr[-3000:]}",
            )
            break
        rc, stdout, stderr = done[label]
        results[label] = Result(rc, stdout, stderr)
    return results


#: damaged runs per interpreter: the report's first plot costs ~1 s (matplotlib's import), each
#: later one ~0.4 s
BATCH = 6


def build_corpus(base: Path, names: list[str] | None = None) -> dict[str, dict[str, Result]]:
    pristine = _pristine(base)
    names = names or list(CASES)
    cases = {n: CASES[n] for n in names} | {"": Case("none", lambda run: None)}
    jobs = [job for n, c in cases.items() for job in _damaged(base, pristine, n or "pristine", c)]
    per = BATCH * len(COMMANDS)
    batches = [jobs[i : i + per] for i in range(0, len(jobs), per)]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        done: dict[str, Result] = {}
        for part in pool.map(_run_batch, [base] * len(batches), range(len(batches)), batches):
            done.update(part)
    out: dict[str, dict[str, Result]] = {n: {} for n in cases}
    for key, res in done.items():
        name, label = key.split("\t")
        out["" if name == "pristine" else name][label] = res
    for res_of in out.values():  # a batch that died leaves the commands after it unrun: failed
        for label in COMMANDS:
            res_of.setdefault(label, Result(-1, "", "not run: its batch died before it"))
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Result]]:
    return build_corpus(tmp_path_factory.mktemp("corrupt"))


def _export_rows(res: Result) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(res.stdout)))


@pytest.mark.parametrize("name", sorted(CASES))
def test_no_traceback_and_one_line(corpus: dict[str, dict[str, Result]], name: str) -> None:
    for label, res in corpus[name].items():
        what = f"{name}: stallscope {label} -> {res.rc}\n{res.stderr[-3000:]}"
        assert "Traceback" not in res.stderr, what
        assert res.rc in (0, 1, 2), what
        assert len(res.stderr.splitlines()) <= 3, what
        if res.rc != 0:
            lines = res.stderr.splitlines()
            assert len(lines) == 1 and lines[0].startswith("stallscope: error: "), what


@pytest.mark.parametrize("name", sorted(n for n, c in CASES.items() if c.rows_skipped))
def test_bad_rows_are_skipped_and_counted(corpus: dict[str, dict[str, Result]], name: str) -> None:
    res, pristine = corpus[name], corpus[""]
    for label in ("show", "show --json", "diagnose --json", "report", "export csv"):
        assert res[label].rc == 0, (label, res[label].stderr)
    # every good point is still exported, the bad ones are not
    good = _export_rows(pristine["export csv"])
    assert len(good) > 50
    assert _export_rows(res["export csv"]) == good
    assert f"skipped {BAD} unreadable rows" in res["show"].stdout
    for label in ("diagnose --json", "export csv"):  # said once, on stderr
        assert f"skipped {BAD} unreadable rows" in res[label].stderr, label
    assert sum(json.loads(res["show --json"].stdout)["skipped"].values()) == BAD
    assert (
        "skipped" not in json.loads(pristine["show --json"].stdout)
        or not json.loads(pristine["show --json"].stdout)["skipped"]
    )


def test_pristine_reads_clean(corpus: dict[str, dict[str, Result]]) -> None:
    for label, res in corpus[""].items():
        assert res.rc == 0 and not res.stderr, (label, res.stderr)


@pytest.mark.parametrize("name", ["meta_monitor_pid_2_40", "meta_monitor_pid_negative"])
def test_garbage_monitor_pid_is_interrupted_everywhere(
    corpus: dict[str, dict[str, Result]], name: str
) -> None:
    res = corpus[name]
    assert "interrupted" in res["show"].stdout and "interrupted" in res["runs"].stdout
    assert json.loads(res["show --json"].stdout)["state"] == "interrupted"


def test_kill_9_show_and_runs_agree(tmp_path: Path) -> None:
    """After a kill -9 of stallscope, `show` and `runs` both say "interrupted", and the
    duration ends at the last sample instead of growing with the clock."""
    p = subprocess.Popen(
        stallscope_argv("run", "--interval", "0.2", "--", "sleep", "30"),
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(2.0)
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)
    finally:
        [run] = list((tmp_path / "stallscope-runs").iterdir())
        child = json.loads((run / "meta.json").read_text()).get("pid")
        if child:  # the orphaned `sleep` (only ours, by the pid the run recorded)
            os.kill(child, signal.SIGKILL)
    time.sleep(1.5)  # a duration that grew with the clock would now be >= 1.5 s too long

    def cli(*args: str) -> str:
        r = subprocess.run(
            stallscope_argv(*args), cwd=tmp_path, capture_output=True, text=True, timeout=60
        )
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
        return r.stdout

    shown = json.loads(cli("show", str(run), "--json"))
    [listed] = json.loads(cli("runs", "--json"))
    assert shown["state"] == listed["state"] == "interrupted"
    assert "interrupted" in cli("show", str(run))
    assert "interrupted" in cli("runs")
    db = sqlite3.connect(run / "run.db")
    last = db.execute("SELECT MAX(ts) FROM samples").fetchone()[0]
    db.close()
    expected = last - shown["meta"]["start"]
    assert shown["duration_s"] == pytest.approx(expected, abs=0.01)
    assert listed["duration_s"] == pytest.approx(expected, abs=0.1)
    assert expected < time.time() - shown["meta"]["start"] - 1.0


if __name__ == "__main__":
    # the counts: cases per category, and how many tracebacked (any command)
    with tempfile.TemporaryDirectory() as d:
        results = build_corpus(Path(d))
    per: dict[str, list[int]] = {}
    for name, case in CASES.items():
        tb = [label for label, r in results[name].items() if "Traceback" in r.stderr]
        bad_rc = [label for label, r in results[name].items() if r.rc not in (0, 1, 2)]
        per.setdefault(case.category, [0, 0, 0])
        per[case.category][0] += 1
        per[case.category][1] += bool(tb)
        per[case.category][2] += len(tb)
        if tb or bad_rc:
            print(f"  {name}: traceback in {', '.join(tb)}; rc>2 in {bad_rc}")
    print(f"{'category':14} cases  cases-with-traceback  tracebacks(cmd runs)")
    for cat, (n, cases_tb, tbs) in per.items():
        print(f"{cat:14} {n:5}  {cases_tb:20}  {tbs:5}")
    print(
        f"{'total':14} {sum(v[0] for v in per.values()):5}  "
        f"{sum(v[1] for v in per.values()):20}  {sum(v[2] for v in per.values()):5}"
    )


@pytest.mark.parametrize("bad", ["/" + "x" * 5000, "/tmp/a\0b", "relative/../../x" * 300])
def test_a_bad_line_in_the_run_index_is_skipped_everywhere(tmp_path: Path, bad: str) -> None:
    """A line no path can be (5,000 characters: ENAMETOOLONG; a NUL byte) in runs.txt: `runs`,
    `show latest` and `top` go on as if it were not there, one line each, no traceback."""
    state = tmp_path / "state"
    state.mkdir()
    (state / "runs.txt").write_text(bad + "\n")
    env = {**os.environ, "STALLSCOPE_STATE_DIR": str(state)}
    for args in (["runs"], ["show", "latest"], ["top", "--count", "1", "--no-agent"]):
        r = subprocess.run(
            stallscope_argv(*args),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert "Traceback" not in r.stderr, (args, r.stderr[-1500:])
        assert r.returncode in (0, 1, 2), (args, r.returncode, r.stderr[-500:])  # 2: no run
        assert len(r.stderr.strip().splitlines()) <= 1, (args, r.stderr[-500:])
