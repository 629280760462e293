"""``stallscope top`` in a real terminal (tmux), and piped.

Each tmux test runs its own tmux server (``-L`` socket, no user config) so nothing of the
user's tmux is touched, and kills it in a ``finally``. The watched tree is a real child: a
parent holding ~150 MiB that forked one worker burning a CPU, so sorting by CPU puts the worker
first and sorting by memory the parent."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import ROOT, stallscope_argv, tool_missing

TREE = textwrap.dedent("""
    import os, sys, time
    if len(sys.argv) > 1:
        with open("/proc/self/comm", "w") as f:
            f.write(sys.argv[1])
    worker = os.fork()
    if worker == 0:
        while True:
            pass
    held = bytearray(b"\\x01") * (150 << 20)
    print(os.getpid(), worker, flush=True)
    time.sleep(120)
""")

#: the SGR parameters that set a colour (foreground, background, 256/true colour, bright)
_COLOUR = re.compile(r"\x1b\[([0-9;]*)m")


def _has_colour(text: str) -> bool:
    for m in _COLOUR.finditer(text):
        for p in (m.group(1) or "0").split(";"):
            if p and ((30 <= int(p) <= 49 and int(p) not in (39, 49)) or 90 <= int(p) <= 107):
                return True
    return False


@pytest.fixture
def tree() -> Iterator[tuple[int, int]]:
    """(parent pid, worker pid) of a running tree; both killed afterwards."""
    proc = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    parent, worker = (int(x) for x in proc.stdout.readline().split())
    try:
        yield parent, worker
    finally:
        for pid in (worker, parent):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=10)


class Tmux:
    """A private tmux server with one session running ``command``."""

    def __init__(self, command: str, width: int, height: int, env: dict[str, str]) -> None:
        if shutil.which("tmux") is None:
            tool_missing("tmux")  # CI installs it (scripts/test.sh): missing is a failure
        self.sock = f"stallscope-test-{uuid.uuid4().hex[:10]}"
        self.env = env
        self._tmux(
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-s",
            "top",
            "-x",
            str(width),
            "-y",
            str(height),
            command,
        )

    def _tmux(self, *args: str) -> str:
        return subprocess.run(
            ["tmux", "-L", self.sock, *args],
            env=self.env,
            check=True,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout

    def screen(self, escapes: bool = False) -> str:
        return self._tmux("capture-pane", "-p", *(["-e"] if escapes else []), "-t", "top")

    def lines(self) -> list[str]:
        return self.screen().split("\n")

    def keys(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", "top", *keys)

    def show(self, fmt: str) -> str:
        return self._tmux("display-message", "-p", "-t", "top", fmt).strip()

    def wait_for(self, ok: Callable[[str], bool], what: str, timeout: float = 10.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            text = self.screen()
            if ok(text):
                return text
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; screen:\n{text}")
            time.sleep(0.1)

    def kill(self) -> None:
        subprocess.run(
            ["tmux", "-L", self.sock, "kill-server"], env=self.env, capture_output=True, timeout=10
        )


def _env(**extra: str) -> dict[str, str]:
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        LANG="C.UTF-8",
        LC_ALL="C.UTF-8",
        TERM="xterm-256color",
        **extra,
    )
    # the pane's size is the terminal's: a COLUMNS/LINES inherited from the test runner (pytest-
    # xdist's workers set 80x24) would override it, as they should for a real user
    for k in ("NO_COLOR", "COLUMNS", "LINES"):
        env.pop(k, None)
    env.update(extra)
    return env


def _top_command(*args: str) -> str:
    """top in the session, then its exit code and the terminal's settings, then a pause so
    the pane stays to be read."""
    argv = " ".join(shlex.quote(a) for a in stallscope_argv("top", *args))
    return f"{argv}; echo EXITED $?; stty -a | tr ' ;' '\\n\\n' | grep -x -- '-*icanon'; sleep 60"


def _proc_rows(screen: str) -> list[str]:
    """The process table's rows (pids first), in screen order."""
    lines = screen.split("\n")
    start = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("PID "))
    return [ln for ln in lines[start + 1 :] if re.match(r"\s*\d+ ", ln)]


def _filled(pids: tuple[int, int]) -> Callable[[str], bool]:
    def ok(text: str) -> bool:
        if not ("cpu " in text and "DISK" in text and "sort: cpu" in text):
            return False
        # a whole frame: tmux may be read while a frame is half written (a 120x40 frame is
        # several pty reads), the new top half above the old bottom, its footer not yet drawn
        if "quit" not in text.rstrip("\n").split("\n")[-1]:
            return False
        rows = _proc_rows(text)
        # both processes listed with a CPU rate (the second sample has one)
        return {int(r.split()[0]) for r in rows if re.search(r"\s\d+\.\d\s", r)} >= set(pids)

    return ok


@pytest.mark.tmux
def test_top_80x24_panels_sort_keys_and_quit(tree: tuple[int, int]) -> None:
    parent, worker = tree
    t = Tmux(_top_command("--pid", str(parent), "--interval", "0.5"), 80, 24, _env())
    try:
        t0 = time.monotonic()
        screen = t.wait_for(_filled(tree), "the panels to fill")
        filled_s = time.monotonic() - t0
        lines = screen.split("\n")
        assert lines[0].startswith("stallscope top"), lines[0]
        assert "q quit" in lines[23], "footer on the last line of a 24-line terminal"
        order = [
            next(i for i, ln in enumerate(lines) if ln.startswith(p))
            for p in ("gpu", "cpu ", "mem ", "DISK", "PROCESSES")
        ]
        assert order == sorted(order), order
        assert "CMDLINE" not in screen and "rareq-sz" not in screen  # narrow layout
        assert t.show("#{alternate_on}") == "1"  # the full screen, not scrolling output
        rows = _proc_rows(screen)
        assert int(rows[0].split()[0]) == worker, rows  # CPU order: the burning worker first
        assert "CPU%▼" in screen

        t.keys("m")
        screen = t.wait_for(lambda s: "sort: mem" in s, "sort by memory")
        rows = _proc_rows(screen)
        assert int(rows[0].split()[0]) == parent, rows  # holds 150 MiB
        assert "RSS MiB▼" in screen and "CPU%▼" not in screen

        t.keys("c")
        screen = t.wait_for(lambda s: "sort: cpu" in s, "sort by CPU again")
        assert int(_proc_rows(screen)[0].split()[0]) == worker

        t.keys("p")
        t.wait_for(lambda s: "PAUSED" in s, "paused")
        t.keys("p")
        t.wait_for(lambda s: "PAUSED" not in s, "resumed")

        t0 = time.monotonic()
        t.keys("q")
        screen = t.wait_for(lambda s: "EXITED" in s, "exit after q", timeout=10)
        quit_s = time.monotonic() - t0
        assert "EXITED 0" in screen
        # the terminal is back: canonical mode again (stty prints icanon, not -icanon),
        # the main screen, the cursor shown
        t.wait_for(lambda s: "icanon" in s, "stty output")
        assert "-icanon" not in t.screen()
        assert t.show("#{alternate_on}") == "0"
        assert t.show("#{cursor_flag}") == "1"
        # generous ceilings for a busy 2-core machine: quitting takes well under a second,
        # filling two refreshes of 0.5 s plus the start
        assert quit_s < 5, quit_s
        assert filled_s < 15, filled_s
    finally:
        t.kill()


def _picked(screen_with_escapes: str) -> int | None:
    """The pid of the row drawn in reverse video (the picked process), if any."""
    sgr = re.compile(r"\x1b\[([0-9;]*)m")
    for ln in screen_with_escapes.split("\n"):
        lead = re.match(r"(?:\x1b\[[0-9;]*m)+", ln)  # the codes before the first character
        if lead is None or not any("7" in c.split(";") for c in sgr.findall(lead.group(0))):
            continue
        m = re.match(r"\s*(\d+) ", sgr.sub("", ln))
        if m:
            return int(m.group(1))
    return None


@pytest.mark.tmux
def test_top_help_overlay_and_a_picked_process_that_stays_picked(tree: tuple[int, int]) -> None:
    """? shows the keys and any key closes them; j picks the first process (the burning
    worker, by CPU), and it stays picked when the sort puts the parent first; Enter makes the
    TRAINING panel follow it; Esc drops the pick."""
    parent, worker = tree
    t = Tmux(_top_command("--pid", str(parent), "--interval", "0.5"), 100, 30, _env())
    try:
        t.wait_for(_filled(tree), "the panels to fill")
        t.keys("?")
        screen = t.wait_for(lambda s: "KEYS" in s, "the help overlay")
        assert "pick a process in the list" in screen and "PROCESSES" not in screen
        t.keys("x")
        t.wait_for(lambda s: "KEYS" not in s and "PROCESSES" in s, "the help closed")
        t.keys("j")
        deadline = time.monotonic() + 10
        while _picked(t.screen(escapes=True)) != worker:
            assert time.monotonic() < deadline, t.screen(escapes=True)
            time.sleep(0.1)
        t.keys("m")  # memory order: the parent (150 MiB) moves to the top
        screen = t.wait_for(lambda s: "sort: mem" in s, "sort by memory")
        assert int(_proc_rows(screen)[0].split()[0]) == parent
        assert _picked(t.screen(escapes=True)) == worker  # the pick followed the process
        t.keys("k")  # up: the row above it, now the parent
        deadline = time.monotonic() + 10
        while _picked(t.screen(escapes=True)) != parent:
            assert time.monotonic() < deadline, t.screen(escapes=True)
            time.sleep(0.1)
        t.keys("Enter")
        t.wait_for(lambda s: f"training of pid {parent}" in s, "the panel following it")
        t.keys("Escape")
        deadline = time.monotonic() + 10
        while _picked(t.screen(escapes=True)) is not None:
            assert time.monotonic() < deadline, t.screen(escapes=True)
            time.sleep(0.1)
        t.keys("q")
        t.wait_for(lambda s: "EXITED 0" in s, "exit after q")
    finally:
        t.kill()


@pytest.mark.tmux
def test_top_sigterm_restores_terminal(tree: tuple[int, int]) -> None:
    t = Tmux(_top_command("--pid", str(tree[0]), "--interval", "0.5"), 80, 24, _env())
    try:
        t.wait_for(lambda s: "DISK" in s, "the first frame")
        shell = int(t.show("#{pane_pid}"))
        kids = Path(f"/proc/{shell}/task/{shell}/children").read_text().split()
        top = next(int(k) for k in kids if b"stallscope" in Path(f"/proc/{k}/cmdline").read_bytes())
        os.kill(top, signal.SIGTERM)
        screen = t.wait_for(lambda s: "EXITED" in s and "icanon" in s, "exit after SIGTERM")
        assert "EXITED 143" in screen
        assert "-icanon" not in screen
        assert t.show("#{alternate_on}") == "0"
    finally:
        t.kill()


@pytest.mark.tmux
def test_top_120x40_uses_the_width_no_color(tree: tuple[int, int]) -> None:
    t = Tmux(_top_command("--pid", str(tree[0]), "--interval", "0.5"), 120, 40, _env(NO_COLOR="1"))
    try:
        screen = t.wait_for(_filled(tree), "the panels to fill")
        lines = screen.split("\n")
        assert "CMDLINE" in screen and "rareq-sz" in screen and "WRITE kB/s" in screen
        assert max(len(ln) for ln in lines) > 100
        assert "q quit" in lines[39]
        # the command line is shown, its program without the directory (which would take
        # the whole column when the checkout lies deep)
        assert re.search(r"\bpython[0-9.]* -c", screen), screen
        assert "bin/python" not in screen
        assert not _has_colour(t.screen(escapes=True))  # NO_COLOR: reverse/bold only
        t.keys("q")
        t.wait_for(lambda s: "EXITED 0" in s, "exit after q", timeout=5)
    finally:
        t.kill()


def test_top_piped_prints_plain_frames() -> None:
    # a process whose name carries a terminal escape sequence: shown escaped, never raw
    proc = subprocess.Popen(
        [sys.executable, "-c", TREE, "\x1b[31mevil\x07"], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    parent, worker = (int(x) for x in proc.stdout.readline().split())
    try:
        for extra in ({}, {"NO_COLOR": "1"}):
            t0 = time.monotonic()
            out = subprocess.run(
                [
                    *stallscope_argv(
                        "top", "--count", "2", "--interval", "0.5", "--pid", str(parent)
                    )
                ],
                capture_output=True,
                text=True,
                timeout=30,
                env=_env(**extra),
            )
            took = time.monotonic() - t0
            assert out.returncode == 0, out.stderr
            assert "\x1b" not in out.stdout and "\x07" not in out.stdout
            assert out.stdout.count("stallscope top") == 2, out.stdout
            assert "DISK" in out.stdout and "cpu " in out.stdout
            assert "\\x1b[31mevil" in out.stdout  # the name, escaped
            assert str(worker) in out.stdout
            assert took < 20, took  # two frames 0.5 s apart and the start: a generous ceiling
            # for files and logs: no key hint, full lines, no padding (issue 40)
            assert "Ctrl-C" not in out.stdout and "quit" not in out.stdout
            lines = out.stdout.splitlines()
            assert not [ln for ln in lines if ln != ln.rstrip()]
            assert any(ln.startswith("sample ") and ln.endswith("ms CPU") for ln in lines)
    finally:
        os.kill(worker, signal.SIGKILL)
        proc.kill()
        proc.wait(timeout=10)


def test_a_missing_pid_is_the_same_line_and_exit_2_for_top_and_run() -> None:
    """top --pid and run --pid say the same about a pid that is not there (issue 40: top said
    "not readable in /proc" with exit 1, run "no such process" with exit 2)."""
    said = []
    for cmd in ("top", "run"):
        out = subprocess.run(
            stallscope_argv(cmd, "--pid", "999999999"),
            capture_output=True,
            text=True,
            timeout=30,
            env=_env(),
        )
        assert out.returncode == 2, (cmd, out.stderr)
        assert out.stdout == ""
        assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr
        said.append(out.stderr)
    assert said[0] == said[1] and "--pid 999999999: no such process" in said[0], said


def test_run_refuses_to_watch_itself() -> None:
    """`exec` makes the shell's $$ the pid of the stallscope process: one line, exit 2, no hang
    (issue 40: it hung on Ctrl-C)."""
    argv = stallscope_argv("run", "--pid", "$$")
    cmd = "exec " + " ".join(shlex.quote(a) if a != "$$" else a for a in argv)
    out = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=30, env=_env())
    assert out.returncode == 2, out.stderr
    assert "that is this stallscope process itself" in out.stderr
    assert out.stderr.count("\n") == 1


@pytest.mark.tmux
def test_top_shows_the_probe_live_and_the_verdict_so_far(tmp_path: Path) -> None:
    """A real training (the demo: a prep-bound DataLoader) under `stallscope run`; top --pid on
    its trainer shows the live data wait from the probe, and the verdict so far."""
    import psutil

    env = _env()
    run = subprocess.Popen(
        [
            *stallscope_argv(
                "run", "--quiet", "--interval", "1", "--out", str(tmp_path / "runs"), "--"
            ),
            sys.executable,
            str(ROOT / "examples" / "train_cpu.py"),
            # epochs and seconds enough to outlast the test on a loaded machine (with the default
            # 2 epochs of 600 files the piped frame at the end found the trainer gone: reproduced
            # in the parallel pass); the test ends it with SIGINT in any case
            "--max-seconds",
            "300",
            "--epochs",
            "1000",
            "--files",
            "600",
            "--model",
            "tiny",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    t = None
    try:
        deadline = time.monotonic() + 30
        trainer = None
        while trainer is None and time.monotonic() < deadline:
            kids = psutil.Process(run.pid).children()
            trainer = next((k.pid for k in kids if "train_cpu.py" in " ".join(k.cmdline())), None)
            time.sleep(0.2)
        assert trainer is not None, "the trainer did not start"
        t = Tmux(_top_command("--pid", str(trainer), "--interval", "1"), 100, 30, env)
        screen = t.wait_for(
            lambda s: re.search(r"TRAINING\s+data wait \d+%", s) is not None and "steps/s" in s,
            "the training line",
            timeout=40,
        )
        line = next(ln for ln in screen.split("\n") if ln.startswith("TRAINING"))
        share = int(re.search(r"data wait (\d+)%", line).group(1))  # type: ignore[union-attr]
        assert share >= 15, line  # the demo waits on its one slow worker
        assert "run " in line and "verdict" in screen
        t.keys("q")
        t.wait_for(lambda s: "EXITED 0" in s, "exit after q", timeout=5)
        # piped: one frame, the verdict computed for it
        out = subprocess.run(
            stallscope_argv("top", "--pid", str(trainer), "--count", "1"),
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert out.returncode == 0, out.stderr
        verdicts = [ln for ln in out.stdout.split("\n") if ln.startswith("verdict")]
        assert verdicts, out.stdout[-3000:] + out.stderr[-1000:]  # the frame, when it has none
        verdict = verdicts[0]
        assert "input_bound" in verdict, out.stdout
    finally:
        if t is not None:
            t.kill()
        run.send_signal(signal.SIGINT)
        try:
            run.wait(timeout=30)
        except subprocess.TimeoutExpired:
            run.kill()


def test_top_reads_a_running_agent_and_falls_back_when_it_stops(tmp_path: Path) -> None:
    """A real agent: top takes the machine-wide readings from its /api/v1/snapshot (the header
    says so); when the agent stops, top goes on sampling directly and says so."""
    from test_agent import start_agent, stop_agent

    agent = start_agent(tmp_path, interval="0.5")
    try:
        proc = subprocess.Popen(
            stallscope_argv("top", "--agent", agent.url, "--interval", "0.5", "--count", "6"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        assert proc.stdout is not None
        first = []
        for line in proc.stdout:  # the first frame (it ends with its cost line), then stop
            first.append(line)
            if line.startswith("sample ") and "ms CPU" in line:
                break
        frame = "".join(first)
        assert "via agent 127.0.0.1:" in frame and "DISK" in frame and "cpu " in frame
        stop_agent(agent)
        rest, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "stopped answering" in rest  # the note
        last = rest.strip().split("\n\n")[-1]
        assert "DISK" in last and re.search(r"cpu\s+\d", last), last
    finally:
        stop_agent(agent)
    # --agent naming nothing that answers: one line, exit 2
    r = subprocess.run(
        stallscope_argv("top", "--agent", agent.url, "--count", "1"),
        capture_output=True,
        text=True,
        timeout=30,
        env=_env(),
    )
    assert r.returncode == 2 and "no stallscope agent answers there" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "snapshot", [b"{}", b"garbage", b'{"ts": 1, "host": [1, 2], "disk": "x", "gpu": {}}', b"[]"]
)
def test_top_against_an_agent_whose_snapshot_is_not_one(snapshot: bytes) -> None:
    """Something that answers /api/v1/health as an agent does but gives an empty, garbage or
    odd-shaped snapshot: top reads the machine itself, draws its frames and stops at --count
    (it drew nothing and never exited)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Fake(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = (
                b'{"sources": {"host": {"up": true}}, "interval_s": 0.5}'
                if self.path.startswith("/api/v1/health")
                else snapshot
            )
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_a: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Fake)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        r = subprocess.run(
            stallscope_argv(
                "top",
                "--agent",
                f"http://127.0.0.1:{srv.server_address[1]}",
                "--interval",
                "0.3",
                "--count",
                "2",
            ),
            capture_output=True,
            text=True,
            timeout=60,
            env=_env(),
        )
    finally:
        srv.shutdown()
        srv.server_close()
    assert r.returncode == 0, r.stderr[-1500:]
    assert r.stdout.count("stallscope top") == 2 and re.search(r"cpu\s+\d", r.stdout), r.stdout
    assert "Traceback" not in r.stderr
