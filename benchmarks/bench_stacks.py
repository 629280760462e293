"""What sampling the training thread's stack costs the trainer: the in-process sampler that
``stallscope run`` injects, and py-spy attached from outside (``run --pid``). Goals: <= 1 %
fewer steps per second, and <= 1 % of one core of sampler CPU.

    .venv/bin/python benchmarks/bench_stacks.py [--seconds 6] [--rounds 3] [--rate 50]
                                  [--pyspy-rates 20[,50]] [--toggle 30] [--wait-idle 2]

Defaults take about 2.5 minutes on 2 cores. The trainer is a CPU PyTorch loop written here,
run as a subprocess for ``--seconds`` after a warm-up: a DataLoader with one worker and a
moderate per-sample transform (crop, flip, blur, normalize) feeding a small CNN's forward,
backward and optimizer step (one torch thread), so the training thread both waits for batches
and computes. It reports its steps per second over the timed window.

Arms, each a fresh trainer, run in rounds whose order alternates (ABC, CBA, ...) so that a
drift of the machine's load affects all alike:

* ``baseline``: no sampling;
* ``in-process``: the trainer started as ``stallscope run`` starts it (the folder holding the
  injected ``sitecustomize.py`` first on ``PYTHONPATH``, ``STALLSCOPE_RUN_DIR`` a temporary run
  directory, ``STALLSCOPE_STACKS_HZ`` ``--rate``). Its thread's CPU is read from
  ``/proc/<pid>/task/<tid>/stat`` (utime + stime) when the timed window starts and ends; the
  thread is the one whose ``comm`` is ``stallscope-stack`` (Python >= 3.14 names OS threads),
  else the native id of the Python thread ``stallscope-stacks`` that the trainer reports. The
  trainer's own reading of that thread's CPU clock is printed as a check. A trainer whose
  sampler thread is missing or stopped fails the benchmark;
* ``py-spy N Hz``: :class:`~stallscope.sources.stacks.pyspy.PySpySampler` on the trainer's pid
  for the timed window, at each of ``--pyspy-rates`` (default: py-spy's default rate). py-spy's
  CPU is the ``RUSAGE_CHILDREN`` delta of this process over the window (py-spy rounds are
  children the sampler waits for; the trainer is reaped only afterwards), less one
  ``py-spy dump`` (the sampler's start-up check, measured just before).

Fresh trainers differ by several % from one another even on an idle machine (measured on a
2-core VM: baseline spreads of ±2 to ±12 %), more than the 1 % goal; so ``--toggle`` also runs
one trainer that starts and stops an :class:`~stallscope.sources.stacks.inproc.InProcSampler`
itself, in windows of 0.2 s of steps, ABBA / BAAB, and prints the mean change of steps/s with
the sampler over the blocks, with its standard error.

Protocol with the trainer (stdin/stdout lines): it prints ``ready {...}`` after the warm-up
and waits for ``go``; times ``--seconds`` of steps; prints ``done {...}`` and waits for
``exit``, so that its threads can still be read. Every wait has a timeout; a trainer that
fails or hangs is killed with its process group, and the benchmark stops with its stderr.

Also printed: CPU per step of the trainer and its worker; the rate the in-process sampler
achieved and the phase shares it saw in the timed windows (a check that it sampled the
training thread); and the CPU that other processes used during the timed windows: on a busy
machine steps/s are noisy (``--wait-idle`` waits a little for a quiet machine before each
trainer, and ``--rounds`` more rounds help).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))

import psutil  # noqa: E402

from stallscope.errors import SourceUnavailable  # noqa: E402
from stallscope.sources.stacks import inproc, pyspy  # noqa: E402
from stallscope.sources.stacks.aggregate import read_records  # noqa: E402

TRAINER = textwrap.dedent('''
    import json, os, select, sys, threading, time

    import torch
    from torch import nn
    from torch.utils.data import DataLoader, Dataset

    SECONDS, WARMUP = float(sys.argv[1]), float(sys.argv[2])
    TOGGLE = sys.argv[3:6]  # "toggle", rate, run dir: switch a sampler on and off


    class Images(Dataset):
        """Synthetic 3x72x72 images, made from the index, with a moderate transform."""

        def __len__(self):
            return 10 ** 8

        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            img = torch.randint(0, 256, (3, 72, 72), dtype=torch.uint8, generator=g)
            x = img.float().div_(255)
            y0, x0 = (i * 7) % 9, (i * 13) % 9
            x = x[:, y0:y0 + 64, x0:x0 + 64]
            if i % 2:
                x = x.flip(-1)
            k = torch.full((3, 1, 5, 5), 1 / 25)
            for _ in range(2):  # a 9x9 blur in two passes
                x = nn.functional.conv2d(x[None], k, padding=2, groups=3)[0]
            x = (x - x.mean()) / (x.std() + 1e-6)
            return x, i % 10


    def sampler_thread():
        for t in threading.enumerate():
            if t.name == "stallscope-stacks":
                return t
        return None


    def thread_cpu(t):
        if t is None or not t.is_alive():
            return None
        try:
            return time.clock_gettime(time.pthread_getcpuclockid(t.ident))
        except (OSError, AttributeError):
            return None


    def wait_for(word, timeout):
        r, _, _ = select.select([sys.stdin], [], [], timeout)
        if not r or sys.stdin.readline().strip() != word:
            print(f"trainer: no {word!r} from the benchmark", file=sys.stderr, flush=True)
            os._exit(3)


    def main():
        torch.set_num_threads(1)
        torch.manual_seed(0)
        model = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(16 * 16 * 16, 10))
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        loader = DataLoader(Images(), batch_size=32, num_workers=1)
        batches = iter(loader)

        def train(until, steps=None):
            n = 0
            for x, y in batches:
                opt.zero_grad(set_to_none=True)
                loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                n += 1
                if n == steps or (steps is None and time.perf_counter() >= until):
                    break
            return n

        t0 = time.perf_counter()
        warm = train(t0 + WARMUP)
        if TOGGLE:
            toggle(train, warm / (time.perf_counter() - t0))
            return
        st = sampler_thread()
        print("ready " + json.dumps({"pid": os.getpid(),
                                     "sampler_tid": st.native_id if st else None}), flush=True)
        wait_for("go", 120)
        c0 = thread_cpu(st)
        t_go = time.time()
        t0 = time.perf_counter()
        n = train(t0 + SECONDS)
        dt = time.perf_counter() - t0
        c1 = thread_cpu(st)
        cpu = None if c0 is None or c1 is None else c1 - c0
        print("done " + json.dumps({"steps": n, "seconds": dt, "steps_per_s": n / dt,
                                    "sampler_cpu_s": cpu, "t_go": t_go, "t_done": time.time(),
                                    "sampler_alive": bool(st and st.is_alive())}), flush=True)
        wait_for("exit", 120)


    def toggle(train, rate):
        """Windows of k steps (about 0.2 s: short windows cancel the drift of the step time
        best), the sampler off (0) or on (1) in ABBA / BAAB blocks, timed. A sampler started
        for a window takes its first sample one period in."""
        from stallscope.sources.stacks.inproc import InProcSampler

        hz, run_dir = float(TOGGLE[1]), TOGGLE[2]
        k = max(3, round(rate * 0.2))
        windows = []
        end = time.perf_counter() + SECONDS
        block = 0
        while time.perf_counter() < end:
            for on in ((0, 1, 1, 0) if block % 2 == 0 else (1, 0, 0, 1)):
                sampler = InProcSampler(run_dir, hz) if on else None
                if sampler is not None:
                    sampler.start()
                t0 = time.perf_counter()
                train(None, k)
                windows.append((block, on, time.perf_counter() - t0))
                if sampler is not None:
                    sampler.stop()
            block += 1
        print("toggle " + json.dumps({"k": k, "windows": windows}), flush=True)


    main()
''')

CLK_TCK = os.sysconf("SC_CLK_TCK")


class TrainerFailed(RuntimeError):
    pass


def inject_dir() -> Path:
    """The folder ``stallscope run`` puts first on the trainer's PYTHONPATH (the one holding
    the injected ``sitecustomize.py``), wherever this checkout keeps it."""
    import stallscope

    pkg = Path(stallscope.__file__).parent
    for d in (
        Path(inproc.__file__).with_name("inject"),
        pkg / "inject",
        *sorted(p.parent for p in pkg.rglob("inject/sitecustomize.py")),
    ):
        if (d / "sitecustomize.py").is_file():
            return d
    raise SystemExit(f"bench_stacks: no inject/sitecustomize.py under {pkg}")


# --- reading threads and processes -------------------------------------------------------------


def thread_ticks(pid: int, tid: int) -> int | None:
    """utime + stime of one thread, in clock ticks (None when it is gone)."""
    try:
        with open(f"/proc/{pid}/task/{tid}/stat", encoding="ascii", errors="replace") as fh:
            fields = fh.read().rpartition(")")[2].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])  # fields 14 and 15 of stat(5), after "pid (comm)"


def find_sampler_tid(pid: int, reported: int | None) -> tuple[int | None, str]:
    """The sampler thread's id and how it was found: its comm, else the trainer's report."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None, "trainer gone"
    for tid in tids:
        try:
            comm = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
        except OSError:
            continue
        if comm == "stallscope-stacks"[:15]:
            return int(tid), "comm"
    if reported is not None and str(reported) in tids:
        return reported, "native_id"
    return None, "not found"


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def busy_cpu() -> float:
    """CPU seconds all cores spent busy, machine-wide."""
    t = psutil.cpu_times()
    return sum(getattr(t, k, 0.0) for k in ("user", "nice", "system", "irq", "softirq", "steal"))


def tree_cpu(pid: int) -> tuple[float, float]:
    """CPU seconds of a process with its live descendants (the trainer and its DataLoader
    worker), and of this benchmark process."""
    trainer = 0.0
    try:
        p = psutil.Process(pid)
        procs = [p, *p.children(recursive=True)]
    except psutil.Error:
        procs = []
    for q in procs:
        try:
            t = q.cpu_times()
            trainer += t.user + t.system
        except psutil.Error:
            pass
    t = psutil.Process(os.getpid()).cpu_times()
    return trainer, t.user + t.system


def wait_idle(cap_s: float, below: float = 0.25) -> float:
    """Wait until the machine's busy CPU over half a second is under ``below`` of a core, at
    most ``cap_s``; returns the seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < cap_s:
        b0 = busy_cpu()
        time.sleep(0.5)
        if (busy_cpu() - b0) / 0.5 < below:
            break
    return time.monotonic() - t0


# --- one trainer -------------------------------------------------------------------------------


class Trainer:
    """One trainer subprocess in its own process group, its stdout lines read by a thread."""

    def __init__(
        self, script: Path, seconds: float, warmup: float, env: dict[str, str], workdir: Path
    ) -> None:
        self.seconds = seconds
        self.stderr_path = workdir / "stderr.txt"
        self._err = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(script), str(seconds), str(warmup)],
            env=env,
            cwd=workdir,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._err,
            text=True,
            start_new_session=True,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def expect(self, word: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                line = self._lines.get(timeout=max(left, 0.01))
            except queue.Empty:
                raise TrainerFailed(
                    f"no {word!r} from the trainer in {timeout:.0f} s {self.stderr_tail()}"
                ) from None
            if line is None:
                self.proc.wait(timeout=5)
                raise TrainerFailed(
                    f"the trainer exited ({self.proc.returncode}) before "
                    f"{word!r} {self.stderr_tail()}"
                )
            if line.startswith(word + " "):
                return json.loads(line[len(word) + 1 :])

    def send(self, word: str) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(word + "\n")
            self.proc.stdin.flush()
        except OSError:
            pass

    def finish(self) -> None:
        """Let the trainer exit; kill its process group if it does not."""
        self.send("exit")
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        self.kill()

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            self.proc.wait(timeout=10)
        else:  # the DataLoader worker of a trainer that died
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
        for f in (self.proc.stdin, self._err):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass

    def stderr_tail(self) -> str:
        try:
            text = self.stderr_path.read_text(errors="replace").strip()
        except OSError:
            return ""
        return ("; its stderr:\n" + "\n".join(text.splitlines()[-15:])) if text else ""


def run_arm(
    arm: tuple[str, float],
    script: Path,
    args: argparse.Namespace,
    base_env: dict[str, str],
    tmp: Path,
) -> dict[str, Any]:
    """One trainer under one arm: ("baseline", 0), ("inproc", hz) or ("pyspy", hz)."""
    kind, hz = arm
    work = Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=tmp))
    env = dict(base_env)
    run_dir = work / "run"
    if kind == "inproc":
        run_dir.mkdir()
        inject = str(inject_dir())
        path = env.get("PYTHONPATH")
        env.update(
            PYTHONPATH=inject + (os.pathsep + path if path else ""),
            STALLSCOPE_RUN_DIR=str(run_dir),
            STALLSCOPE_STACKS_HZ=f"{hz:g}",
        )
    out: dict[str, Any] = {"arm": arm}
    sampler: pyspy.PySpySampler | None = None
    tr = Trainer(script, args.seconds, args.warmup, env, work)
    try:
        ready = tr.expect("ready", 120)
        pid = ready["pid"]
        tid = None
        if kind == "inproc":
            tid, how = find_sampler_tid(pid, ready.get("sampler_tid"))
            if tid is None:
                raise TrainerFailed(f"no sampler thread in the trainer ({how}) {tr.stderr_tail()}")
            out["found_by"] = how
        elif kind == "pyspy":
            run_dir.mkdir()
            sampler = pyspy.PySpySampler(run_dir / "stacks", [pid], rate_hz=hz)
            sampler.check(pid)  # once for the page cache
            c_a = children_cpu()
            sampler.check(pid)
            c_b = children_cpu()
            check_cpu = c_b - c_a
        busy0, (tree0, self0) = busy_cpu(), tree_cpu(pid)
        ticks0 = thread_ticks(pid, tid) if tid is not None else None
        t0 = time.monotonic()
        if sampler is not None:
            sampler.start()  # one more check, then rounds
        tr.send("go")
        done = tr.expect("done", args.seconds + 120)
        if sampler is not None:
            sampler.stop()
            sampler = None
            out["sampler_cpu_s"] = max(children_cpu() - c_b - check_cpu, 0.0)
        ticks1 = thread_ticks(pid, tid) if tid is not None else None
        t1 = time.monotonic()
        busy1, (tree1, self1) = busy_cpu(), tree_cpu(pid)
        out["other_cpu_s"] = max(
            (busy1 - busy0) - (tree1 - tree0) - (self1 - self0) - out.get("sampler_cpu_s", 0.0), 0.0
        )
        out["cpu_per_step_ms"] = (tree1 - tree0) / max(done["steps"], 1) * 1e3
        out["wall_s"] = t1 - t0
        out["steps_per_s"] = done["steps_per_s"]
        if kind == "inproc":
            if ticks0 is None or ticks1 is None or not done["sampler_alive"]:
                raise TrainerFailed("the sampler thread stopped during the timed window")
            out["sampler_cpu_s"] = (ticks1 - ticks0) / CLK_TCK
            out["sampler_cpu_self_s"] = done["sampler_cpu_s"]
            out["trainer_s"] = done["seconds"]
        tr.finish()
        if kind == "inproc":
            # the records written within the timed window (one a second, each the second
            # before its ts)
            recs = [
                r
                for r in read_records(run_dir)
                if done["t_go"] + 1.0 <= r["ts"] <= done["t_done"] + 0.01
            ]
            n = sum(r.get("n", 0) for r in recs)
            secs: dict[str, float] = {}
            for r in recs:
                for k, v in r["s"].items():
                    secs[k] = secs.get(k, 0.0) + v
            total = sum(secs.values())
            training = {k: v for k, v in secs.items() if k not in ("startup", "tail")}
            out["achieved_hz"] = n / total if total else 0.0
            out["window_records"] = len(recs)
            tt = sum(training.values())
            out["shares"] = {k: v / tt for k, v in training.items()} if tt else {}
        return out
    finally:
        if sampler is not None:
            sampler.stop()
        tr.kill()
        shutil.rmtree(work, ignore_errors=True)


def run_toggle(
    script: Path, args: argparse.Namespace, base_env: dict[str, str], tmp: Path
) -> dict[str, Any]:
    """One trainer that starts and stops an in-process sampler itself, window by window
    (ABBA / BAAB blocks of ``k`` steps each): the sampler's cost without the variation between
    processes. Returns the per-block changes of steps/s with the sampler, in %."""
    work = Path(tempfile.mkdtemp(prefix="toggle-", dir=tmp))
    (work / "run").mkdir()
    cmd = [
        sys.executable,
        str(script),
        str(args.toggle),
        str(args.warmup),
        "toggle",
        f"{args.rate:g}",
        str(work / "run"),
    ]
    proc = subprocess.Popen(
        cmd,
        env=base_env,
        cwd=work,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=args.toggle + args.warmup + 120)
    except subprocess.TimeoutExpired:
        out, err = "", "timed out"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait()
        shutil.rmtree(work, ignore_errors=True)
    lines = [ln for ln in out.splitlines() if ln.startswith("toggle ")]
    if not lines:
        raise TrainerFailed(
            "the toggling trainer gave no result: " + "\n".join(err.strip().splitlines()[-15:])
        )
    res = json.loads(lines[-1][len("toggle ") :])
    blocks: dict[int, list[float]] = {}
    for block, on, dt in res["windows"]:
        blocks.setdefault(block, [0.0, 0.0])[on] += dt
    changes = [(off / on - 1) * 100 for off, on in blocks.values() if off > 0 and on > 0]
    return {"k": res["k"], "changes": changes}


# --- report ------------------------------------------------------------------------------------


def name_of(arm: tuple[str, float]) -> str:
    kind, hz = arm
    return {
        "baseline": "baseline",
        "inproc": f"in-process {hz:g} Hz",
        "pyspy": f"py-spy {hz:g} Hz",
    }[kind]


def pct(x: float) -> str:
    return f"{x:+.1f}%"


def parse_rates(text: str) -> list[float]:
    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of rates: {text!r}") from None
    if any(not 1 <= r <= 1000 for r in rates):
        raise argparse.ArgumentTypeError("rates are 1 to 1000 Hz")
    return rates


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=6.0, help="timed seconds per trainer")
    ap.add_argument("--warmup", type=float, default=2.0, help="untimed seconds before them")
    ap.add_argument("--rounds", type=int, default=3, help="trainers per arm (alternating)")
    ap.add_argument(
        "--rate",
        type=float,
        default=inproc.DEFAULT_RATE_HZ,
        help=f"in-process sampler's rate, Hz (default {inproc.DEFAULT_RATE_HZ:g})",
    )
    ap.add_argument(
        "--pyspy-rates",
        type=parse_rates,
        default=[pyspy.DEFAULT_RATE_HZ],
        metavar="HZ[,HZ]",
        help="py-spy arms (default "
        f"{pyspy.DEFAULT_RATE_HZ:g}, its default; 20,50 adds one; '' none)",
    )
    ap.add_argument(
        "--wait-idle",
        type=float,
        default=2.0,
        metavar="S",
        help="before each trainer, wait up to S seconds for other processes to "
        "leave the machine idle (default 2; 0: no wait)",
    )
    ap.add_argument(
        "--toggle",
        type=float,
        default=30.0,
        metavar="S",
        help="also S seconds of one trainer switching the in-process sampler on "
        "and off every 0.2 s (default 30; 0: not run)",
    )
    args = ap.parse_args()
    if args.seconds <= 0 or args.rounds < 1 or not 1 <= args.rate <= 1000:
        ap.error("--seconds > 0, --rounds >= 1, --rate 1 to 1000")

    arms: list[tuple[str, float]] = [("baseline", 0.0), ("inproc", args.rate)]
    if args.pyspy_rates and pyspy.pyspy_path() is None:
        print("py-spy is not installed: its arms are left out")
    elif args.pyspy_rates:
        arms += [("pyspy", hz) for hz in dict.fromkeys(args.pyspy_rates)]
    base_env = {
        k: v for k, v in os.environ.items() if not k.startswith("STALLSCOPE_") and k != "PYTHONPATH"
    }
    base_env["PYTHONPATH"] = str(HERE)  # the injected sitecustomize imports this checkout

    import torch  # only for its version

    cores = os.cpu_count() or 1
    try:
        usable = len(os.sched_getaffinity(0))
    except OSError:
        usable = cores
    print(
        f"machine: {cores} cores ({usable} usable), load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; python {sys.version.split()[0]}, "
        f"torch {torch.__version__}"
    )
    rates = ", ".join(f"{hz:g}" for k, hz in arms if k == "pyspy") or "none"
    print(
        f"rates: in-process {args.rate:g} Hz (its default {inproc.DEFAULT_RATE_HZ:g}), "
        f"injected from {inject_dir().relative_to(HERE)}; py-spy {rates} Hz (its default "
        f"{pyspy.DEFAULT_RATE_HZ:g}), {pyspy.pyspy_path() or 'not installed'}"
    )
    print(
        f"trainer: CPU CNN, 1 torch thread, DataLoader with 1 worker; {args.warmup:g} s "
        f"warm-up + {args.seconds:g} s timed; {args.rounds} rounds of {len(arms)} arms, "
        "order alternating"
        + (
            f"; then {args.toggle:g} s of one trainer switching the in-process sampler on and off"
            if args.toggle > 0
            else ""
        )
    )

    started = time.monotonic()
    results: dict[tuple[str, float], list[dict[str, Any]]] = {a: [] for a in arms}
    rounds: list[dict[tuple[str, float], dict[str, Any]]] = []
    waited = 0.0
    with tempfile.TemporaryDirectory(prefix="bench-stacks-") as d:
        tmp = Path(d)
        script = tmp / "trainer.py"
        script.write_text(TRAINER)
        for r in range(args.rounds):
            this_round: dict[tuple[str, float], dict[str, Any]] = {}
            for arm in arms if r % 2 == 0 else arms[::-1]:
                if arm not in arms:  # py-spy could not attach in an earlier round
                    continue
                waited += wait_idle(args.wait_idle) if args.wait_idle > 0 else 0.0
                try:
                    res = run_arm(arm, script, args, base_env, tmp)
                except SourceUnavailable as exc:  # py-spy without ptrace rights, say
                    print(f"py-spy arms left out: {exc}")
                    arms = [a for a in arms if a[0] != "pyspy"]
                    continue
                except TrainerFailed as exc:
                    print(f"bench_stacks: {name_of(arm)}: {exc}", file=sys.stderr)
                    return 1
                results[arm].append(res)
                this_round[arm] = res
                print(
                    f"  round {r + 1} {name_of(arm):18s} {res['steps_per_s']:6.2f} steps/s, "
                    f"{res['cpu_per_step_ms']:5.1f} ms CPU/step; other processes "
                    f"{res['other_cpu_s'] / res['wall_s'] * 100:3.0f}% of a core",
                    flush=True,
                )
            rounds.append(this_round)
        toggled = None
        if args.toggle > 0:
            waited += wait_idle(args.wait_idle) if args.wait_idle > 0 else 0.0
            try:
                toggled = run_toggle(script, args, base_env, tmp)
            except TrainerFailed as exc:
                print(f"bench_stacks: toggling trainer: {exc}", file=sys.stderr)
                return 1
    elapsed = time.monotonic() - started
    report(arms, results, rounds, usable)
    if toggled is not None and toggled["changes"]:
        ch = toggled["changes"]
        se = statistics.stdev(ch) / len(ch) ** 0.5 if len(ch) > 1 else float("nan")
        print(
            f"in-process {args.rate:g} Hz switched on and off inside one trainer "
            f"({args.toggle:g} s, {len(ch)} ABBA blocks of {toggled['k']}-step windows): "
            f"steps/s {pct(statistics.mean(ch))} ± {se:.1f}% with the sampler (mean over "
            f"blocks ± standard error; median {pct(statistics.median(ch))}; goal >= -1%)"
        )
    print(f"total {elapsed:.0f} s, of which {waited:.0f} s waiting for an idle machine")
    return 0


def report(
    arms: list[tuple[str, float]],
    results: dict[tuple[str, float], list[dict[str, Any]]],
    rounds: list[dict[tuple[str, float], dict[str, Any]]],
    usable: int,
) -> None:
    base_arm = ("baseline", 0.0)
    base = [x["steps_per_s"] for x in results[base_arm]]
    base_med = statistics.median(base)
    base_cpu = statistics.median(x["cpu_per_step_ms"] for x in results[base_arm])
    spread = (max(base) - min(base)) / 2 / base_med * 100

    def paired(arm: tuple[str, float], key: str) -> float:
        """median over rounds of (arm / the baseline of its round - 1), in %"""
        v = [
            (rd[arm][key] / rd[base_arm][key] - 1) * 100
            for rd in rounds
            if arm in rd and base_arm in rd
        ]
        return statistics.median(v) if v else float("nan")

    print()
    print(
        f"{'arm':18s} {'steps/s':>8s} {'vs base':>8s} {'paired':>8s} {'CPU/step':>9s} "
        f"{'sampler CPU':>12s}  goals: loss <= 1%, sampler CPU <= 1% of a core"
    )
    print(
        f"{'baseline':18s} {base_med:8.2f} {'':8s} {'':8s} {base_cpu:6.1f} ms {'':12s}  runs "
        + ", ".join(f"{x:.2f}" for x in base)
        + f" steps/s (spread ±{spread:.1f}%)"
    )
    summary = []
    for arm in arms:
        rs = results[arm]
        if arm == base_arm or not rs:
            continue
        med = statistics.median(x["steps_per_s"] for x in rs)
        loss = (med / base_med - 1) * 100
        cpu = statistics.median(x["sampler_cpu_s"] / x["wall_s"] * 100 for x in rs)
        verdict = (
            "met"
            if -loss <= 1.0 and cpu <= 1.0
            else "CPU over"
            if -loss <= 1.0
            else f"loss over{' (within the spread)' if -loss <= spread else ''}"
            + ("" if cpu <= 1.0 else ", CPU over")
        )
        print(
            f"{name_of(arm):18s} {med:8.2f} {pct(loss):>8s} {pct(paired(arm, 'steps_per_s')):>8s}"
            f" {pct(paired(arm, 'cpu_per_step_ms')):>9s} {cpu:11.2f}%  {verdict}; runs "
            + ", ".join(f"{x['steps_per_s']:.2f}" for x in rs)
        )
        who = "sampler" if arm[0] == "inproc" else "py-spy"
        summary.append(
            f"{name_of(arm)}: {med:.2f} steps/s vs {base_med:.2f} baseline "
            f"({pct(loss)}), {who} CPU {cpu:.2f}% of a core"
        )
        if arm[0] == "inproc":
            own = [
                x["sampler_cpu_self_s"] / x["trainer_s"] * 100
                for x in rs
                if x.get("sampler_cpu_self_s") is not None
            ]
            hz = statistics.median(x["achieved_hz"] for x in rs)
            shares: dict[str, float] = {}
            for x in rs:
                for k, v in x["shares"].items():
                    shares[k] = shares.get(k, 0.0) + v / len(rs)
            seen = sorted(shares.items(), key=lambda kv: -kv[1])
            summary.append(
                f"  its thread found by {rs[0]['found_by']}; its CPU by its own clock "
                + (f"{statistics.median(own):.2f}%" if own else "n/a")
                + " of a core (/proc "
                f"stat counts {1000 / CLK_TCK:.0f} ms ticks); achieved {hz:.1f} samples/s; "
                "phases it saw in the timed windows: "
                + ", ".join(f"{k} {v * 100:.0f}%" for k, v in seen)
            )
    print()
    for ln in summary:
        print(ln)
    others = [x["other_cpu_s"] / x["wall_s"] * 100 for rs in results.values() for x in rs]
    busy = statistics.median(others)
    print(
        f"other processes used {busy:.0f}% of a core (median; max {max(others):.0f}%) of "
        f"the {usable * 100}% during the timed windows"
        + ("; a busy machine: steps/s and CPU/step are noisy" if busy > 10 else "")
    )
    print(
        "vs base: median steps/s of the arm / of the baseline; paired: median over rounds of "
        "the run / the baseline of its round; CPU/step: trainer + DataLoader worker, paired"
    )


if __name__ == "__main__":
    sys.exit(main())
