from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

#: this folder: the helper modules (this one, logreaders, cli_batch, replay_agent...), fixtures/,
#: trainings/ and promtool/; the tests themselves are one level down, in unit/, integration/
#: and scenarios/ (tests/README.md). pytest puts this folder on sys.path (it has no
#: __init__.py), so a test in any tier imports the helpers by name: ``from conftest import ROOT``.
TESTS_DIR = Path(__file__).resolve().parent
FIXTURES = TESTS_DIR / "fixtures"
# the agent's and Prometheus's helpers live beside the integration tests (test_agent,
# test_agent_deploy...): a scenario that needs them imports them by name whichever files a run
# collects (pytest puts a folder on sys.path only once it collects a test from it)
if str(TESTS_DIR / "integration") not in sys.path:
    sys.path.append(str(TESTS_DIR / "integration"))

# A suite started in the background (`scripts/test.sh &`) inherits SIGINT ignored, and an
# ignored signal stays ignored across exec: the tests that press Ctrl-C on a child would find
# it deaf. A handler (not an ignore) is reset to the default in every child.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
#: the repository
ROOT = TESTS_DIR.parent
#: meta.json keys every run has, whichever started it (`stallscope run` or the standalone probe)
META_KEYS = {
    "command",
    "host",
    "start",
    "end",
    "exit_code",
    "interval_s",
    "data",
    "data_devices",
    "versions",
    "logical_cores",
    "physical_cores",
    "mem_total_mib",
    "unavailable",
    "pid",
    "samples",
}


def terminate(proc: subprocess.Popen[Any], timeout: float = 10.0) -> None:
    """Stop a process the tests started: SIGTERM, then SIGKILL after ``timeout`` seconds."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


#: real components a test may need, by marker (pyproject.toml declares the markers): any one of
#: each tuple's executables on PATH, or (``module:``) an importable module. A test carrying the
#: marker fails when it is missing (CI installs them all), unless
#: STALLSCOPE_ALLOW_MISSING_TOOLS=1; ``scripts/test.sh --fast`` leaves these tests out.
COMPONENTS: dict[str, tuple[tuple[str, ...], ...]] = {
    "prometheus": (("prometheus",), ("promtool",)),
    "alertmanager": (("prometheus-alertmanager", "alertmanager"),),
    "chromium": (("chromium", "chromium-browser", "google-chrome"),),
    "tmux": (("tmux",),),
    "tensorflow": (("module:tensorflow",),),
    "torchrun": (("module:torch.distributed.run",),),
    "fio": (("fio",),),
}


def _present(name: str) -> bool:
    if name.startswith("module:"):
        import importlib.util

        try:
            return importlib.util.find_spec(name[len("module:") :]) is not None
        except ModuleNotFoundError:
            return False
    return shutil.which(name) is not None


def pytest_runtest_setup(item: pytest.Item) -> None:
    for marker, needs in COMPONENTS.items():
        if item.get_closest_marker(marker) is None:
            continue
        for choices in needs:
            if not any(_present(n) for n in choices):
                tool_missing(" or ".join(n.removeprefix("module:") for n in choices))


#: when a test's setup began: the process's CPU seconds then (:func:`_cpu_s`)
_CPU_AT = pytest.StashKey[float]()


def _cpu_s() -> float:
    """CPU seconds of this pytest process and of the children it has waited for (a child's
    own waited-for children included: a trainer's DataLoader workers under `stallscope run`)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    item.stash[_CPU_AT] = _cpu_s()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Each test's CPU seconds, setup to teardown, as the JUnit property ``cpu_s`` (its
    teardown report carries it; ``scripts/suite_times.py`` sums it per file): a pass on 2
    cores is CPU-bound, so its CPU says where its time can be won. A child that the test
    leaves running is counted in the test that waits for it."""
    if call.when == "teardown" and _CPU_AT in item.stash:
        item.user_properties.append(("cpu_s", round(_cpu_s() - item.stash[_CPU_AT], 2)))
    yield


#: markers of tests that run a training or a heavy real component for seconds to a minute
LONG = ("slow", "prometheus", "alertmanager", "chromium", "tmux", "tensorflow", "torchrun", "fio")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The files that hold long tests first, the order within each group kept: scripts/test.sh
    hands out whole files to its workers in this order (``--dist loadfile
    --no-loadscope-reorder``), so the short files fill in at the end. xdist's own order (most
    tests first) started the 80-s scenario files last, one worker running them alone."""
    long_files = {item.path for item in items if any(item.get_closest_marker(m) for m in LONG)}
    items.sort(key=lambda item: item.path not in long_files)


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES


def env_without_stallscope(*drop: str) -> dict[str, str]:
    """This process's environment without stallscope's variables (and ``drop``), except the
    test's private state dir: a child must not write to the user's run index."""
    return {
        k: v
        for k, v in os.environ.items()
        if (k == "STALLSCOPE_STATE_DIR" or not k.startswith("STALLSCOPE_")) and k not in drop
    }


def stallscope_argv(*args: str) -> list[str]:
    """argv that runs the CLI of this checkout with the test's interpreter."""
    return [sys.executable, "-m", "stallscope", *args]


def cli_json(*args: str) -> Any:
    """What ``stallscope ARGS`` (a command given --json) prints, parsed: run in this process
    through the CLI's own entry point (``stallscope.cli.main``, stdout and stderr caught), not
    as ``python -m stallscope``, whose interpreter and imports cost ~0.6 s a call (0.04 s here
    once imported). For the commands the scenarios run after each training (diagnose, compare);
    the child-process path of each command is tested in tests/integration (test_cli.py,
    test_compare.py...). A non-zero exit fails with the command's stderr."""
    import contextlib
    import io
    import json

    from stallscope.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(args))
    assert rc == 0, f"stallscope {' '.join(args)}: exit code {rc}\n{err.getvalue()[-3000:]}"
    return json.loads(out.getvalue())


def run_own_loop(
    tmp_path: Path, data: Path, trainer: list[str], wrap: list[str] | None = None
) -> dict[str, Any]:
    """``stallscope run --data DATA -- [WRAP] python TRAINER...`` for a trainer that times its
    own wait for batches and prints ``data wait: X% of S s`` (examples/train_memmap.py,
    train_threads.py), then its ``diagnose --json`` with that truth as ``trainer_wait``."""
    import re
    import subprocess
    import sys

    out = tmp_path / "runs"
    argv = [
        *stallscope_argv("run", "--interval", "1", "--out", str(out), "--data", str(data)),
        "--",
        *(wrap or []),
        sys.executable,
        *trainer,
    ]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    [run_dir] = list(out.iterdir())
    doc: dict[str, Any] = cli_json("diagnose", str(run_dir), "--json")
    m = re.search(r"data wait: ([0-9.]+)% of", r.stdout)
    assert m, r.stdout[-1000:]
    doc["trainer_wait"] = float(m.group(1)) / 100
    return doc


def training_finding(doc: dict[str, Any]) -> dict[str, Any]:
    """The diagnosis's first finding about the training itself: its first finding, or the one
    after ``cpu_contention`` when that leads. That one fires only on what the run measured: every
    trainer process waited for a CPU ≥ RUNQ_BUSY_PCT of the time while other processes kept ≥
    OTHERS_BUSY_CORES busy: a CPU hog beside the suite, or the test beside it in the parallel
    pass. The busy host then rightly comes first, and a test of what the training itself does
    reads the next one."""
    from stallscope.analysis.facts.build import OTHERS_BUSY_CORES, RUNQ_BUSY_PCT

    findings = doc["findings"]
    assert findings, doc
    if findings[0]["kind"] != "cpu_contention":
        return dict(findings[0])
    ev = findings[0]["evidence"]
    assert ev["runq_wait_pct"] >= RUNQ_BUSY_PCT and ev["others_cpu_cores"] >= OTHERS_BUSY_CORES, ev
    rest = [f for f in findings if f["kind"] != "cpu_contention"]
    assert rest, [f["kind"] for f in findings]
    return dict(rest[0])


def rediagnosed(doc: dict[str, Any], *, stacks: bool) -> dict[str, Any]:
    """The run of ``doc`` (a `diagnose --json` document with its "run") diagnosed again from
    what a trainer without the probe leaves: its steps and probes set aside, and its sampled
    stacks too unless ``stacks`` (`stallscope run --no-stacks`). The process, host and disk
    readings are the same: the probe only times the steps."""
    import json

    from stallscope.analysis.diagnose import diagnose
    from stallscope.analysis.rundata import load_run

    data = load_run(Path(doc["run"]))
    data.meta["run_dir"] = doc["run"]
    data.steps, data.probes = [], []
    if not stacks:
        data.stacks = []
    out: dict[str, Any] = json.loads(json.dumps(diagnose(data), default=str))
    if "trainer_wait" in doc:
        out["trainer_wait"] = doc["trainer_wait"]
    return out


def tool_missing(tool: str) -> None:
    """Fail when a required real tool is missing, unless explicitly allowed (local dev)."""
    if os.environ.get("STALLSCOPE_ALLOW_MISSING_TOOLS") == "1":
        pytest.skip(f"{tool} not installed (allowed by STALLSCOPE_ALLOW_MISSING_TOOLS=1)")
    pytest.fail(f"{tool} is not installed; CI installs it in .ci/run")


#: where `stallscope run` and the standalone probe put runs when started in the checkout without
#: --out or $STALLSCOPE_OUT: a test that does so leaves a run that the user's `show latest`
#: then shows (issue 49). Tests write only to temporary folders.
CHECKOUT_RUNS = ROOT / "stallscope-runs"


def run_folders(folder: Path = CHECKOUT_RUNS) -> set[str]:
    """The names in a runs folder (none when it does not exist)."""
    try:
        return set(os.listdir(folder))
    except OSError:
        return set()


def index_lines(path: Path) -> list[str]:
    """The lines of a run index (none when it cannot be read)."""
    try:
        return path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []


def leaks(
    runs_before: set[str],
    runs_after: set[str],
    index_before: list[str],
    index_after: list[str],
    test_roots: tuple[Path, ...],
) -> list[str]:
    """What a test session left outside its temporary folders, one line each: run folders new
    in the checkout's runs folder, and lines new in the real user's run index naming a run
    under ``test_roots`` (the session's temporary folders, the checkout). A line naming another
    folder is the user's own run, made beside the suite: not counted."""
    out = [
        f"{CHECKOUT_RUNS / name}: a run folder left in the checkout"
        for name in sorted(runs_after - runs_before)
    ]
    seen = set(index_before)
    for line in index_after:
        if line in seen or not line.strip():
            continue
        path = Path(line)
        if any(path.is_relative_to(root) for root in test_roots):
            out.append(f"{line}: added to the user's run index")
    return out


def _real_index() -> Path:
    """The user's own run index, as stallscope finds it from this environment (before the
    session's own state dir is set)."""
    from stallscope.store.index import index_path

    return index_path(os.environ)


def _test_roots(config: pytest.Config) -> tuple[Path, ...]:
    """Where this session's runs are: its temporary folders (pytest's base temp, which holds
    the xdist workers' too) and the checkout. Not the whole of /tmp: people run stallscope
    there beside the suite, into their own index."""
    factory = getattr(config, "_tmp_path_factory", None)
    base = factory.getbasetemp().resolve() if factory is not None else None
    return (ROOT,) if base is None else (base, ROOT)


_BEFORE = pytest.StashKey[tuple[set[str], Path, list[str]]]()


def pytest_configure(config: pytest.Config) -> None:
    """Per-user state of the whole session (module- and session-scoped fixtures run before any
    test's own state dir below) goes to a temp dir too: runs made by those fixtures landed in
    the user's run index, and a user who had run the suite saw them in `stallscope runs`.
    The session's first process (not an xdist worker, whose environment is already the
    session's) notes the checkout's runs and the user's index for pytest_sessionfinish."""
    import tempfile

    if not hasattr(config, "workerinput"):
        index = _real_index()
        config.stash[_BEFORE] = (run_folders(), index, index_lines(index))
    os.environ["STALLSCOPE_STATE_DIR"] = tempfile.mkdtemp(prefix="stallscope-test-state-")
    global _CONFIG
    _CONFIG = config


_CONFIG: pytest.Config | None = None
_DATASETS: dict[tuple[str, int, int, int], Path] = {}
#: the example trainers whose dataset a test may share, and their defaults (--files, --size,
#: --classes): train_cpu.py writes images as (C, H, W), train_keras.py as (H, W, C)
DEMO_TRAINERS = {"train_cpu": (3000, 64, 10), "train_keras": (2000, 64, 10)}


def demo_dataset(
    files: int = 3000, size: int = 64, classes: int = 10, trainer: str = "train_cpu"
) -> Path:
    """The dataset examples/<trainer>.py makes with these arguments (its ``make_files``: seeded,
    the same files every time), made once per pytest process in the session's temporary folder
    and handed to every run that reads it unchanged (``--data-dir``). A trainer left to itself
    wrote its files at start-up and removed them at exit, every run: 1-3 s for 3000 (the removal
    up to 9 s beside other engineers' work) outside the seconds it trains, in runs whose
    verdicts read only the training (the probe's steps, the stacks sampled while it trains)."""
    key = (trainer, files, size, classes)
    if key not in _DATASETS:
        assert _CONFIG is not None, "demo_dataset before pytest_configure"
        factory: pytest.TempPathFactory = _CONFIG._tmp_path_factory  # type: ignore[attr-defined]
        root = factory.mktemp(f"{trainer}-{files}-{size}-{classes}", numbered=True)
        make_demo_files(root, files, size, classes, trainer=trainer)
        _DATASETS[key] = root
    return _DATASETS[key]


def make_demo_files(
    root: Path, files: int = 3000, size: int = 64, classes: int = 10, trainer: str = "train_cpu"
) -> None:
    """Write examples/<trainer>.py's dataset into ``root`` with its own ``make_files``, in this
    process: what ``<trainer>.py --data-dir root --epochs 0`` writes, without an interpreter and
    torch's import (~3 s) or TensorFlow's (~5 s) for it. train_keras.py imports TensorFlow at its
    top: its ``make_files`` alone is compiled from its source (numpy and os, nothing else)."""
    import ast
    import importlib.util

    import numpy as np

    path = ROOT / "examples" / f"{trainer}.py"
    if trainer == "train_cpu":
        spec = importlib.util.spec_from_file_location("_train_cpu_datasets", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.make_files(root, files, size, classes)
        return
    assert trainer in DEMO_TRAINERS, trainer
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    [fn] = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "make_files"]
    space: dict[str, Any] = {"np": np, "os": os, "Path": Path}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(path), "exec"), space)
    space["make_files"](root, files, size, classes)


def dataset_args(train_args: list[str], trainer: str = "train_cpu") -> list[str]:
    """``--data-dir`` of this process's copy of the dataset (``demo_dataset``) that
    examples/<trainer>.py's ``train_args`` (their --files, --size, --classes) would make, unless
    they name their own folder (the fetch scenarios', read cold)."""
    if "--data-dir" in train_args:
        return []
    made = dict(zip(("--files", "--size", "--classes"), DEMO_TRAINERS[trainer]))
    for i, arg in enumerate(train_args[:-1]):
        if arg in made:
            made[arg] = int(train_args[i + 1])
    root = demo_dataset(made["--files"], made["--size"], made["--classes"], trainer=trainer)
    return ["--data-dir", str(root)]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The session fails when it left a run in the checkout or in the user's run index (each
    test's own check, below, names the test; this one also sees session fixtures and the
    tests' children that outlive them)."""
    before = session.config.stash.get(_BEFORE, None)
    if before is None:
        return
    runs, index, lines = before
    found = leaks(runs, run_folders(), lines, index_lines(index), _test_roots(session.config))
    if not found:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    text = "tests must write only to temporary folders; this session left:\n  " + "\n  ".join(found)
    if reporter is not None:
        reporter.ensure_newline()
        reporter.write_sep("=", "written outside the tests' temporary folders", red=True)
        reporter.write_line(text)
    else:
        sys.stderr.write(text + "\n")
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(autouse=True)
def _nothing_left_in_the_checkout() -> Iterator[None]:
    """A test that leaves a run folder in the checkout's ./stallscope-runs fails, named (two
    workers run side by side: the folder may be the other worker's test's, which fails too)."""
    before = run_folders()
    yield
    new = run_folders() - before
    if new:
        pytest.fail(
            f"a run was written into the checkout: {sorted(new)} in {CHECKOUT_RUNS}; "
            "tests write only to temporary folders (--out, cwd=tmp_path or "
            "$STALLSCOPE_OUT)",
            pytrace=False,
        )


@pytest.fixture(autouse=True)
def _private_state_dir(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SMART growth state and the run index go to a temp dir of each test, never the user's
    ~/.local/state (and one test's runs never show up in another's `stallscope runs`)."""
    monkeypatch.setenv("STALLSCOPE_STATE_DIR", str(tmp_path_factory.mktemp("state")))


@pytest.fixture
def throttled_group() -> Iterator[str]:
    """A cgroup v1 blkio group name for examples/constrain.py --read-bps (root only), removed
    after the test."""
    if os.geteuid() != 0:
        pytest.skip("the fetch scenario throttles a block device with a cgroup: needs root")
    if not Path("/sys/fs/cgroup/blkio").is_dir():
        pytest.skip("no cgroup v1 blkio hierarchy to throttle reads with")
    name = f"stallscope-test-{os.getpid()}"
    yield name
    subprocess.run(
        [sys.executable, str(ROOT / "examples" / "constrain.py"), "--cleanup", name], check=False
    )


# --- shared by the SMART tests (test_health_fuzz, test_smartctl_mutation, test_faults_io) ---


def json_paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path (keys and list indices) to a value inside a JSON document, depth first."""
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += json_paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += json_paths(v, (*prefix, i))
    return out


def print_drives(console: Any, drives: list[Any]) -> None:
    """``stallscope disk``'s report of ``drives`` (``cli.disk._print_drives``) printed to the
    rich ``console`` instead of the terminal."""
    from stallscope.cli import disk

    old = disk.out_console
    disk.out_console = console
    try:
        disk._print_drives(drives, [])
    finally:
        disk.out_console = old


@pytest.fixture
def probe_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A probe test's environment: no run directory, output folder, probe switch, interval or
    launcher ranks from the caller's; every recorder of this process is closed afterwards."""
    for k in (
        "STALLSCOPE_RUN_DIR",
        "STALLSCOPE_OUT",
        "STALLSCOPE_PROBE",
        "STALLSCOPE_INTERVAL",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
    ):
        monkeypatch.delenv(k, raising=False)
    yield
    from stallscope.probe.recorder import reset

    reset()


def make_run(tmp_path: Path) -> Path:
    """A run directory with an empty run.db, as a probe finds it under `stallscope run` before
    the trainer's first step."""
    from stallscope.store import RunStore, new_run_dir

    run_dir = new_run_dir(tmp_path / "runs", "test")
    RunStore(run_dir / "run.db").close()
    return run_dir
