"""``stallscope tune TARGET [--step STEP] [--budget S] [--json]``: find the DataLoader settings
that feed the training step fastest.

TARGET is ``module:function`` or ``file.py:function``; the function takes no argument and
returns a Dataset, a DataLoader (its settings are the baseline), or a factory taking DataLoader
keyword arguments. Progress goes to stderr; the table and the recommendation to stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from stallscope.cli._common import add_out_option, bounded, out_console, resolve_run
from stallscope.errors import StallscopeError, UsageError
from stallscope.stats import json_finite
from stallscope.textsafe import plain
from stallscope.tuner import DEFAULT_BUDGET_S, TuneResult, tune
from stallscope.tuner.measure import Overtime
from stallscope.tuner.target import check, load, resolve

EXIT_INTERRUPTED = 130


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tune",
        help="find the DataLoader settings that feed your step fastest",
        description="Try DataLoader settings (num_workers up to the usable cores, "
        "prefetch_factor, pin_memory with a GPU, optionally batch sizes) in short trials and "
        "recommend the fastest, with the bound it hit. TARGET is module:function or "
        "file.py:function returning a Dataset, a DataLoader, or a factory taking DataLoader "
        "keyword arguments.",
    )
    p.add_argument(
        "target", metavar="TARGET", nargs="?", help="module:function or file.py:function"
    )
    p.add_argument(
        "--from-run",
        metavar="RUN",
        dest="from_run",
        help="instead of trials: what stallscope.watch(loader, autotune=True) found "
        "in that run (a run directory, its name, or 'latest'), as a DataLoader(...) "
        "call",
    )
    add_out_option(p)
    p.add_argument(
        "--step",
        metavar="STEP",
        help="module:function or file.py:function taking one batch: the training "
        "step (default: none; the loader's own rate is maximised)",
    )
    p.add_argument(
        "--budget",
        type=bounded("--budget", float, 5, 86400),
        default=DEFAULT_BUDGET_S,
        help=f"seconds for all trials (default {DEFAULT_BUDGET_S:g})",
    )
    p.add_argument(
        "--batch-size",
        type=bounded("--batch-size", int, 1, MAX_BATCH),
        help="batch size when TARGET returns a Dataset (default 32)",
    )
    p.add_argument(
        "--try-batch-sizes",
        metavar="N,N",
        type=_sizes,
        default=(),
        help="also try these batch sizes at the best settings (they change the "
        "training, so only when asked)",
    )
    p.add_argument(
        "--max-workers",
        type=bounded("--max-workers", int, 0, 4096),
        help="most workers to try (default: the usable cores)",
    )
    p.add_argument(
        "--start-method",
        choices=("fork", "spawn", "forkserver"),
        help="how DataLoader workers start (default: the platform's)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object (keys: docs/tune.md)")
    p.set_defaults(func=run)


#: seconds past --budget (at least; half the budget for long ones) before a hung dataset is
#: given up on
GRACE_S = 10.0


class TuneError(StallscopeError):
    """The target never answered: one line, exit 1."""

    exit_code = 1


#: the largest batch size either flag takes (2^20)
MAX_BATCH = 1 << 20


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--try-batch-sizes must be integers separated by commas, got {text!r}"
        ) from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"--try-batch-sizes must be positive, got {text!r}")
    if max(sizes) > MAX_BATCH:  # as --batch-size: no DataLoader batch is that large
        raise argparse.ArgumentTypeError(
            f"--try-batch-sizes must be at most {MAX_BATCH:,}, got {max(sizes):,}"
        )
    if len(sizes) > 64:
        raise argparse.ArgumentTypeError(
            f"--try-batch-sizes takes at most 64 sizes, got {len(sizes)}"
        )
    return sizes


def run(args: argparse.Namespace) -> int:
    if args.from_run is not None:
        if args.target is not None:
            raise UsageError("give TARGET or --from-run RUN, not both")
        return from_run(args)
    if args.target is None:
        raise UsageError(
            "tune needs TARGET (module:function or file.py:function) or --from-run RUN"
        )
    check(args.target)  # what is wrong with TARGET without importing anything: said at once
    try:
        import torch  # noqa: F401
    except ImportError:
        raise UsageError("stallscope tune needs PyTorch: pip install 'stallscope[torch]'") from None
    # the dataset's code runs in this process (its import; __getitem__ at num_workers=0): a
    # hang there would outlast the budget, so a timer ends it (Overtime, as Ctrl-C would)
    grace = max(GRACE_S, 0.5 * args.budget)
    fired: list[bool] = []

    def overtime(_sig: int, _frame: Any) -> None:
        fired.append(True)
        raise Overtime(
            f"no answer from {args.target} within --budget {args.budget:g} s and "
            f"{grace:g} s more: it hangs in this process (at import, or reading a "
            "sample without workers)"
        )

    old = signal.signal(signal.SIGALRM, overtime)
    signal.setitimer(signal.ITIMER_REAL, args.budget + grace)
    try:
        return _tune(args)
    except Overtime as exc:  # before the search began (importing the target): nothing found
        raise TuneError(str(exc)) from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _tune(args: argparse.Namespace) -> int:
    obj = load(args.target)
    step = resolve(args.step) if args.step else None
    if step is not None and not callable(step):
        raise UsageError(f"{args.step} is not callable: --step names a function taking a batch")
    err = Console(stderr=True)
    with Progress(
        TextColumn("tuning [bold]{task.fields[label]}"),
        BarColumn(),
        TextColumn("{task.completed:.0f}/{task.total:.0f} s"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    ) as bar:
        task = bar.add_task("tune", total=args.budget, label="…")

        def progress(label: str, elapsed: float) -> None:
            bar.update(task, completed=min(elapsed, args.budget), label=label)
            if not err.is_terminal:
                err.print(
                    f"trying {label} ({elapsed:.0f} s of {args.budget:g})",
                    highlight=False,
                    markup=False,
                )

        result = tune(
            obj,
            step_fn=step,
            budget_s=args.budget,
            batch_size=args.batch_size,
            max_workers=args.max_workers,
            start_method=args.start_method,
            batch_sizes=args.try_batch_sizes,
            progress=progress,
        )
    if args.json:
        sys.stdout.write(json.dumps(result.to_json()) + "\n")
    else:
        print_result(result, out_console)
    if result.interrupted:
        return 1 if result.stopped.startswith("no answer from") else EXIT_INTERRUPTED
    return 0 if result.samples_per_s else 1


def _config_text(config: dict[str, Any]) -> str:
    keys = [
        k
        for k in (
            "num_workers",
            "prefetch_factor",
            "persistent_workers",
            "pin_memory",
            "batch_size",
        )
        if k in config
    ]
    return " ".join(f"{k}={config[k]}" for k in keys)


#: the columns of the trials' table besides the configuration take about this many characters;
#: where the longest configuration does not fit beside them (a pipe is 80 columns wide), the
#: configurations go under the table, numbered, so that no cell has to fold
TABLE_COLUMNS = 80


def print_result(result: TuneResult, console: Console) -> None:
    longest = max((len(_config_text(t.config)) for t in result.trials), default=0)
    wide = console.width >= longest + TABLE_COLUMNS
    table = Table(title="DataLoader trials", title_justify="left", show_edge=False)
    if wide:
        table.add_column("configuration", overflow="fold", min_width=14)
    else:
        table.add_column("#", justify="right")
    table.add_column("samples/s", justify="right")
    table.add_column("data wait", justify="right")
    table.add_column("CPU %", justify="right")
    table.add_column("RSS MiB", justify="right")
    table.add_column("start-up s", justify="right")
    table.add_column("", no_wrap=True)
    configs: list[str] = []
    for i, t in enumerate(result.trials):
        cfg = {k: v for k, v in t.config.items() if k not in ("timeout", "multiprocessing_context")}
        is_best = i == result.best_index
        note = "best" if is_best else ("" if t.status == "ok" else t.status)
        if t.repeats > 1:
            note = f"{note} (mean of {t.repeats})".strip()
        configs.append(_config_text(cfg))
        table.add_row(
            configs[-1] if wide else str(i + 1),
            f"{t.samples_per_s:,.0f}" if t.samples_per_s else "-",
            f"{100 * t.data_wait_share:.0f}%" if t.data_wait_share is not None else "-",
            f"{t.cpu_pct:.0f}" if t.cpu_pct is not None else "-",
            f"{t.rss_mib:,.0f}" if t.rss_mib else "-",
            f"{t.startup_s:.2f}" if t.startup_s is not None else "-",
            note,
            style="bold" if is_best else None,
        )
    console.print(table)
    if not wide:
        for i, text in enumerate(configs):
            console.print(
                f"  {i + 1:>2}  {plain(text)}", highlight=False, markup=False, soft_wrap=True
            )
    for t in result.trials:
        if t.reason:
            console.print(
                f"  {_config_text(t.config)}: {t.status}: {plain(t.reason, None)}",
                highlight=False,
                markup=False,
            )
    if result.step_ms is not None:
        console.print(
            f"training step: {result.step_ms:.1f} ms per batch", highlight=False, markup=False
        )
    base = result.baseline.get("samples_per_s")
    if result.samples_per_s and base:
        console.print(
            f"best: {result.samples_per_s:,.0f} samples/s, "
            f"×{result.samples_per_s / base:.2f} the configuration as given "
            f"({base:,.0f} samples/s)"
            + (
                f"; predicted ×{result.predicted_speedup:.2f} before its trial"
                if result.predicted_speedup
                else ""
            ),
            highlight=False,
            markup=False,
        )
    console.print(f"bound: {plain(result.bound, None)}", highlight=False, markup=False)
    console.print(
        f"stopped: {plain(result.stopped, None)} ({result.seconds:.0f} s, "
        f"{result.cores} usable cores)",
        highlight=False,
        markup=False,
    )
    for note in result.notes:  # our own words, whole (clipping is for what a machine says)
        console.print(f"note: {plain(note, None)}", highlight=False, markup=False)
    if result.recommendation:
        console.print("recommended:", highlight=False, markup=False)
        console.print(
            f"    {plain(result.recommendation, None)}",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )


def from_run(args: argparse.Namespace) -> int:
    """What the loader autotune of a run found, per rank: its trials and the call to write."""
    from stallscope.probe.autotune import loader_call
    from stallscope.store import RunStore

    run_dir = resolve_run(args.from_run, args.out)
    db = run_dir / "run.db"
    try:
        store = RunStore(db, readonly=True)
        try:
            probes = store.probes()
        finally:
            store.close()
    except Exception as exc:
        raise StallscopeError(f"cannot read {db}: {exc}") from None
    ranks = []
    for p in probes:
        raw = p.get("config")
        cfg: dict[str, Any] = raw if isinstance(raw, dict) else {}
        at = cfg.get("autotune")
        if not isinstance(at, dict) or not isinstance(at.get("best"), dict):
            continue
        loader = cfg.get("loader")
        given = dict(loader) if isinstance(loader, dict) else {}
        if given.get("sampler_type") == "RandomSampler":
            given["shuffle"] = True
        trials, changes = at.get("trials"), at.get("changes")
        ranks.append(
            {
                "rank": p.get("rank"),
                "best": at["best"],
                # what a run.db edited by hand holds instead of lists is left out
                "trials": [t for t in trials if isinstance(t, dict)]
                if isinstance(trials, list)
                else [],
                "changes": changes if isinstance(changes, list) else [],
                "done": at.get("done"),
                "dataloader": loader_call(at["best"], given),
            }
        )
    if not ranks:
        raise UsageError(
            f"run {run_dir.name} has no loader autotune: its trainer did not use "
            "stallscope.watch(loader, autotune=True) (or ended before an epoch)"
        )
    if args.json:
        # NaN and infinities are not JSON: null
        print(
            json.dumps(
                json_finite({"run": str(run_dir), "ranks": ranks}),
                indent=2,
                default=str,
                allow_nan=False,
            )
        )
        return 0
    for r in ranks:
        out_console.print(
            f"rank {r['rank']}: {len(r['trials'])} epoch(s) measured"
            + ("" if r["done"] else " (still tuning when the run ended)"),
            highlight=False,
        )
        for t in r["trials"] if isinstance(r["trials"], list) else []:
            if not isinstance(t, dict):
                continue  # a run.db edited by hand: what cannot be read is left out
            pf = t.get("prefetch_factor")
            name = plain(
                f"num_workers={t.get('num_workers')}"
                + (f", prefetch_factor={pf}" if pf and t.get("num_workers") else ""),
                60,
            )
            pred = _num(t.get("predicted_rate"))
            out_console.print(
                f"  {name:<34}{_num(t.get('steps_per_s')):6.1f} steps/s  wait "
                f"{_num(t.get('wait_share')):>3.0%}" + (f"  predicted {pred:.1f}" if pred else ""),
                highlight=False,
            )
        out_console.print(f"  use: {plain(r['dataloader'], None)}", highlight=False, soft_wrap=True)
    return 0


def _num(v: Any) -> float:
    """A stored figure as a number (0 when it is not a finite one)."""
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    return float(v) if ok else 0.0
