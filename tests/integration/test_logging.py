"""stallscope logs as a library does (issue 39): through the ``stallscope`` logger, with a
NullHandler; warnings reach stderr as ``stallscope: ...`` while the program configured no
logging, and only the program's handlers once it has; the CLI prints the same plain lines, the
agent logfmt lines with a time and a level."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT, env_without_stallscope, stallscope_argv, terminate

from stallscope.agent.server import AgentHTTPServer
from stallscope.errors import (
    FallbackHandler,
    LogfmtFormatter,
    PlainFormatter,
    logging_configured,
    logging_to_stderr,
    warn,
)
from stallscope.probe.notices import Notices

#: one logfmt line of the agent: time (UTC, ms), level, source, msg, maybe err
LOGFMT_LINE = re.compile(
    r"time=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z level=(DEBUG|INFO|WARN|ERROR) "
    r'source=\S+ msg=(?:[^\s"=]+|"(?:[^"\\]|\\.)*")(?: err=(?:[^\s"=]+|"(?:[^"\\]|\\.)*"))?'
)


def run_python(
    tmp_path: Path, code: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(code))
    full = env_without_stallscope("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    full.update(env or {})
    full["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, str(script), *args],
        cwd=tmp_path,
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


class Kept(logging.Handler):
    """A program's own handler: keeps the records."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def root_handler() -> Iterator[Kept]:
    kept = Kept()
    logging.root.addHandler(kept)
    try:
        yield kept
    finally:
        logging.root.removeHandler(kept)


# --- the library's logger -----------------------------------------------------------------------
def test_importing_stallscope_prints_nothing_and_adds_no_root_handler(tmp_path: Path) -> None:
    r = run_python(
        tmp_path,
        """
        import logging
        import stallscope
        import stallscope.probe
        lg = logging.getLogger("stallscope")
        print(logging.root.handlers == [], [type(h).__name__ for h in lg.handlers],
              lg.level == logging.NOTSET, lg.propagate)
    """,
    )
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert r.stdout == "True ['NullHandler', 'FallbackHandler'] True True\n"


def test_unconfigured_program_sees_warnings_as_before(tmp_path: Path) -> None:
    r = run_python(
        tmp_path,
        """
        import logging
        from stallscope.errors import warn
        warn("one")
        logging.getLogger("stallscope.collect").warning("two %s", 2)
        logging.getLogger("stallscope.agent").info("not a warning: not shown")
        logging.getLogger("someone.else").debug("never")
    """,
    )
    assert (r.returncode, r.stdout) == (0, "")
    assert r.stderr == "stallscope: one\nstallscope: two 2\n"


# --- a trainer that configures logging ------------------------------------------------------------
TRAINER = """
    import logging, sys
    if sys.argv[1] == "stdout":
        logging.basicConfig(stream=sys.stdout, format="LOG %(levelname)s %(name)s %(message)s")
    elif sys.argv[1] == "basic":
        logging.basicConfig()  # stderr, WARNING:name:message
    elif sys.argv[1] == "silence":
        logging.getLogger("stallscope").setLevel(logging.ERROR)
    import stallscope

    for epoch in range(2):
        for batch in stallscope.watch([[1] * 8] * 6):
            pass
    print("trained", flush=True)
"""


@pytest.mark.parametrize("how", ["none", "stdout", "basic", "silence"])
def test_trainer_logging_gets_the_probes_warnings_once(tmp_path: Path, how: str) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")  # the probe cannot make its run directory: one warning
    r = run_python(tmp_path, TRAINER, how, env={"STALLSCOPE_OUT": str(blocker / "out")})
    assert r.returncode == 0 and "trained" in r.stdout, r.stderr
    said = "cannot write step records"
    if how == "none":  # nothing configured: one plain line on stderr, as always
        assert r.stderr.count("stallscope:") == 1 and said in r.stderr, r.stderr
        assert "LOG" not in r.stdout
    elif how == "stdout":  # the trainer's handler has it, and stderr has nothing
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith("LOG ")]
        assert len(lines) == 1 and lines[0].startswith("LOG WARNING stallscope.probe "), r.stdout
        assert said in lines[0]
        assert r.stderr == "", r.stderr
    elif how == "basic":  # basicConfig's own stderr line, not ours beside it
        assert r.stderr.count(said) == 1, r.stderr
        assert r.stderr.startswith("WARNING:stallscope.probe:") and "stallscope: " not in r.stderr
    else:
        assert r.stderr == "", r.stderr


def test_a_handler_on_root_takes_the_warnings_off_stderr(
    root_handler: Kept, capsys: pytest.CaptureFixture[str]
) -> None:
    warn("to the program's handler", "stallscope.probe")
    assert capsys.readouterr().err == ""
    assert [(r.name, r.levelname, r.getMessage()) for r in root_handler.records] == [
        ("stallscope.probe", "WARNING", "to the program's handler")
    ]


def test_a_handler_on_a_stallscope_logger_counts_and_propagate_is_respected(
    root_handler: Kept, capsys: pytest.CaptureFixture[str]
) -> None:
    top, probe = logging.getLogger("stallscope"), logging.getLogger("stallscope.probe")
    own = Kept()
    probe.addHandler(own)
    probe.propagate = False
    try:
        assert logging_configured("stallscope.probe")
        warn("probe only", "stallscope.probe")
        assert [r.getMessage() for r in own.records] == ["probe only"]
        assert root_handler.records == [] and capsys.readouterr().err == ""
    finally:
        probe.removeHandler(own)
        probe.propagate = True
    # the program's handler is on the root, but no stallscope record gets there: stderr
    top.propagate = False
    try:
        assert not logging_configured("stallscope.probe")
        warn("back on stderr", "stallscope.probe")
        assert capsys.readouterr().err == "stallscope: back on stderr\n"
        assert root_handler.records == []
    finally:
        top.propagate = True
    assert logging_configured("stallscope.probe")


def test_without_configuration_notices_say_each_kind_once_on_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # pytest's own log capture on the root logger is no configuration of the program's
    assert not logging_configured("stallscope.probe")
    n = Notices(rank=0)
    for _ in range(3):
        n.say("write", "disk I/O error")
    assert capsys.readouterr().err == "stallscope: disk I/O error\n"


def test_the_fallback_never_raises_on_a_closed_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    class Closed:
        def write(self, text: str) -> int:
            raise ValueError("I/O operation on closed file")

        def flush(self) -> None:
            raise ValueError("I/O operation on closed file")

    monkeypatch.setattr(sys, "stderr", Closed())
    warn("at shutdown")  # nothing raised, nothing printed by logging about it


# --- the CLI and the agent ----------------------------------------------------------------------
def test_cli_handler_prints_the_plain_line_once(capsys: pytest.CaptureFixture[str]) -> None:
    lg = logging.getLogger("stallscope")
    before = list(lg.handlers)
    with logging_to_stderr(PlainFormatter()):
        logging.getLogger("stallscope.collect").warning("cannot write to %s", "/x/run.db")
        logging.getLogger("stallscope.collect").info("quiet")
    assert capsys.readouterr().err == "stallscope: cannot write to /x/run.db\n"
    assert lg.handlers == before  # as it was


def test_agent_handler_stands_in_for_the_cli_one(capsys: pytest.CaptureFixture[str]) -> None:
    lg = logging.getLogger("stallscope")
    before_level = lg.level
    with logging_to_stderr(PlainFormatter()):
        with logging_to_stderr(LogfmtFormatter(), logging.INFO):
            logging.getLogger("stallscope.agent").info("serving")
        logging.getLogger("stallscope.agent").info("not at the CLI's level")
        warn("plain again")
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and LOGFMT_LINE.fullmatch(err[0]), err
    assert " level=INFO source=test_logging.py:" in err[0] and err[0].endswith(" msg=serving")
    assert err[1] == "stallscope: plain again"
    assert lg.level == before_level
    assert [type(h) for h in lg.handlers] == [logging.NullHandler, FallbackHandler]


def record(
    msg: str,
    level: int = logging.WARNING,
    created: float = 1795804801.0429,
    path: str = "/opt/venv/lib/python3.12/site-packages/stallscope/agent/server.py",
    exc: BaseException | None = None,
) -> logging.LogRecord:
    r = logging.LogRecord(
        "stallscope.agent", level, path, 74, msg, None, (type(exc), exc, None) if exc else None
    )
    r.created = created
    return r


def test_logfmt_line() -> None:
    f = LogfmtFormatter()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(1795804801)) + ".042Z"
    assert f.format(record("a request from 10.0.0.7 failed: ValueError: bad")) == (
        f"time={stamp} level=WARN source=agent/server.py:74 "
        'msg="a request from 10.0.0.7 failed: ValueError: bad"'
    )
    assert f.format(record("started", logging.INFO)).endswith(
        " level=INFO source=agent/server.py:74 msg=started"
    )
    # quotes, backslashes, = and newlines: escaped, the line stays one line
    line = f.format(record('say "hi"\nC:\\x a=b', logging.ERROR))
    assert line.endswith(r' level=ERROR source=agent/server.py:74 msg="say \"hi\"\nC:\\x a=b"')
    assert "\n" not in line
    assert " level=ERROR " in f.format(record("x", logging.CRITICAL))
    assert " level=DEBUG " in f.format(record("x", logging.DEBUG))
    assert f.format(record("", path="elsewhere/tool.py")).endswith(' source=tool.py:74 msg=""')
    with_err = f.format(record("scrape failed", exc=OSError("disk full")))
    assert with_err.endswith(' msg="scrape failed" err="OSError: disk full"')
    for ln in (line, with_err):
        assert LOGFMT_LINE.fullmatch(ln), ln


def test_a_failed_request_is_a_warn_line_in_the_agents_log(
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = AgentHTTPServer.__new__(AgentHTTPServer)  # nothing bound: handle_error only
    with logging_to_stderr(LogfmtFormatter(), logging.INFO):
        try:
            raise ValueError("bad header")
        except ValueError:
            server.handle_error(None, ("10.0.0.7", 51234))
        try:
            raise ConnectionResetError("gone")
        except ConnectionResetError:
            server.handle_error(None, ("10.0.0.8", 51235))  # a client that hung up: nothing
    (line,) = capsys.readouterr().err.splitlines()
    assert LOGFMT_LINE.fullmatch(line), line
    assert " level=WARN source=agent/server.py:" in line
    assert line.endswith(' msg="a request from 10.0.0.7 failed: ValueError: bad header"')


def test_the_agent_process_logs_logfmt_lines(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        stallscope_argv(
            "agent",
            "--listen",
            f"127.0.0.1:{port}",
            "--interval",
            "0.5",
            "--store",
            str(tmp_path / "store"),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=dict(env_without_stallscope(), PYTHONPATH=str(ROOT)),
    )
    try:
        first: list[str] = []
        reader = threading.Thread(
            target=lambda: first.append(proc.stderr.readline() if proc.stderr else ""), daemon=True
        )
        reader.start()
        reader.join(30)
        assert first and first[0], "the agent said nothing within 30 s"
        proc.terminate()
        try:
            out, rest = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:  # once, beside the fast tier: say where it hangs
            pytest.fail(
                f"the agent did not stop within 30 s of SIGTERM; its threads:\n"
                f"{_threads_of(proc.pid)}"
            )
    finally:
        terminate(proc)
    assert proc.returncode == 0, [*first, rest]
    lines = [first[0].rstrip("\n"), *rest.splitlines()]
    assert all(LOGFMT_LINE.fullmatch(ln) for ln in lines), lines
    assert " level=INFO source=cli/agent.py:" in lines[0]
    assert f'msg="serving http://127.0.0.1:{port}/metrics every 0.5 s; store ' in lines[0]
    assert 'msg="stopped after ' in lines[-1] and " level=INFO " in lines[-1]
    assert out == ""


def _threads_of(pid: int) -> str:
    """Where each thread of ``pid`` is (py-spy), for a failure's message."""
    spy = Path(sys.executable).with_name("py-spy")
    try:
        res = subprocess.run(
            [str(spy), "dump", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"(py-spy dump failed: {exc})"
    return res.stdout or res.stderr
