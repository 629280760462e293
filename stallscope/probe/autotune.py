"""AUTOTUNE for a PyTorch DataLoader: ``stallscope.watch(loader, autotune=True)`` adjusts its
``num_workers`` and ``prefetch_factor`` between epochs, inside the running training.

Each epoch over the watched loader is a measurement (:class:`EpochTrial`): steps per second,
and per step the data wait ``w`` and the rest ``c`` (compute), all without the first batch
(its wait is the workers starting: the steady pace is what the model predicts). Between two epochs
:func:`decide` picks the next configuration from a resource model in the spirit of Plumber
(MLSys'22):

* at ``num_workers=0`` the main process loads every batch itself, so ``w`` is the load time of
  one batch ``L``. ``k`` workers supply at most ``k / L`` batches per second, the step takes at
  least ``c``, and loading plus computing share the usable cores ``n``: the predicted rate is
  ``min(k / L, 1 / c, n / max(L + c, C))``, where ``C`` is the main process's CPU seconds per
  step over that epoch (more than ``L + c`` when the step computes on several threads). The
  next configuration is the fewest workers that reach 98% of the best predicted rate (at most
  ``n``);
* with workers, while the data wait stays ≥ 5% of the epoch: a worker's load time is
  ``k / rate``; the workers needed, ``ceil(k / rate / c)``, up to ``n``. When more workers were
  tried and cores are left, ``prefetch_factor`` 4 is tried once (uneven batches); with a worker
  per usable core, or with the trainer and its workers keeping ≥ 75% of the usable cores busy
  over the epoch (``CPU_BOUND_SHARE``, the offline tuner's rule too), the CPU is the bound and
  tuning stops;
* a configuration slower than one measured before sends the loader back to the best one, and
  tuning stops; so does a data wait under 5%, a guard that fails (memory for the workers,
  ``/dev/shm`` for their batches, swapping during the epoch), or ``max_trials`` epochs.

The loader changes only between epochs, and only in how it loads: the sampler (and its
generator) and the base seed drawn for each epoch are the same whatever the worker count, so a
seeded sampler yields the same samples in the same order
(``tests/integration/test_autotune.py``). Random transforms drawn inside workers are seeded per
worker by PyTorch, so their draws depend on the worker count, as they do when the count is
changed by hand. With a GPU present ``pin_memory``
is turned on with the first workers (host-to-device copies from pinned pages).

Every change is logged in the run (an ``autotune`` event, shown by ``stallscope show`` and the
report) with the prediction and, one epoch later, the measured rate against it. The best
configuration is kept per loader in the state folder (``autotune.json``): the next run starts
from it. ``stallscope tune --from-run RUN`` prints the ``DataLoader(...)`` call it found.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from stallscope.loadermodel import (
    ALIKE,
    CPU_BOUND_SHARE,
    MEM_SHARE,
    NEAR_BEST,
    keeps_up,
    rate,
    shm_fits,
    shm_need_mib,
    workers_for_step,
)
from stallscope.sources.host import swap_ins

__all__ = ["CPU_BOUND_SHARE", "EpochTrial", "OnlineTuner", "decide", "predict_rate"]

#: epochs autotune may try before it settles
MAX_TRIALS = 4
#: a batch whose CPU exceeds its load and step time by this factor was worked on threads
THREADS_CPU_MARGIN = 1.05
STATE_FILE = "autotune.json"
#: the most of the state file read (a few hundred bytes per loader are written)
MAX_STATE_BYTES = 4 << 20


@dataclass
class EpochTrial:
    """One epoch's measurement at one configuration."""

    num_workers: int
    prefetch_factor: int | None
    steps: int
    wall_s: float
    wait_s: float
    samples: int = 0
    predicted_rate: float | None = None  #: steps/s the model promised for this configuration
    #: the first batch's wait (workers starting, the first loads): left out of the rate, which
    #: is the epoch's steady pace (the model predicts that)
    first_wait_s: float = 0.0
    #: the main process's CPU seconds over the epoch, all its threads (0: not measured); at
    #: num_workers=0 that is loading plus computing, with the step's intra-op threads counted
    cpu_s: float = 0.0
    #: CPU seconds over the epoch of the trainer and its child processes (its DataLoader
    #: workers, live or ended); 0: not measured
    tree_cpu_s: float = 0.0

    def cores_busy(self, cores: int) -> float | None:
        """The share of ``cores`` the trainer and its workers kept busy (None: not measured)."""
        if not self.tree_cpu_s or self.wall_s <= 0 or cores <= 0:
            return None
        return self.tree_cpu_s / (self.wall_s * cores)

    @property
    def cpu_per_step(self) -> float:
        return self.cpu_s / self.steps if self.steps else 0.0

    @property
    def rate(self) -> float:
        span = self.wall_s - self.first_wait_s
        return (self.steps - 1) / span if span > 0 and self.steps > 1 else 0.0

    @property
    def wait_share(self) -> float:
        span = self.wall_s - self.first_wait_s
        return (self.wait_s - self.first_wait_s) / span if span > 0 else 0.0

    @property
    def wait_per_step(self) -> float:
        return (self.wait_s - self.first_wait_s) / (self.steps - 1) if self.steps > 1 else 0.0

    @property
    def compute_per_step(self) -> float:
        return max(0.0, self.wall_s - self.wait_s) / self.steps if self.steps else 0.0

    def config(self) -> dict[str, Any]:
        return {"num_workers": self.num_workers, "prefetch_factor": self.prefetch_factor}


def predict_rate(k: int, load_s: float, compute_s: float, cores: int, cpu_s: float = 0.0) -> float:
    """Steps per second with ``k`` workers (0: the main process loads), from one batch's load
    time, one step's compute and the usable cores: :func:`stallscope.loadermodel.rate` with a
    batch as the item. ``cpu_s``: the CPU seconds one step's loading and computing take in all
    (more than their wall time when the step computes on several threads); the cores bound
    uses the larger of the two."""
    if compute_s <= 0 and load_s <= 0:
        return 0.0
    return rate(
        k,
        max(load_s, 0.0),
        cores=cores,
        step_s=max(compute_s, 0.0),
        main_cpu_s=max(compute_s, cpu_s - load_s, 0.0),
    )


@dataclass
class Decision:
    config: dict[str, Any] | None  #: the next configuration; None: keep the current one
    why: str
    predicted_rate: float | None = None
    done: bool = False  #: tuning is over (the next configuration, if any, is the last)


def decide(
    trials: list[EpochTrial],
    cores: int,
    *,
    max_trials: int = MAX_TRIALS,
    fits: Callable[[dict[str, Any]], str] | None = None,
) -> Decision:
    """The next configuration after ``trials`` (the newest last); see the module docstring.
    ``fits(config)`` says why a configuration does not fit (memory, /dev/shm), "" if it does."""
    cur = trials[-1]
    best = _best(trials)
    ok = fits or (lambda _cfg: "")
    if cur.rate < ALIKE * best.rate and best is not cur:
        return Decision(
            best.config(),
            f"{_name(cur)} ran {cur.rate:.1f} steps/s, slower than "
            f"{_name(best)} ({best.rate:.1f}): back to it",
            best.rate,
            done=True,
        )
    if keeps_up(cur.wait_share):
        return Decision(
            None,
            f"the loader keeps up at {_name(cur)} (data wait {cur.wait_share:.0%} of the epoch)",
            done=True,
        )
    if len(trials) >= max_trials:
        return Decision(
            None if best is cur else best.config(),
            f"{len(trials)} epochs measured: keeping {_name(best)}",
            best.rate,
            done=True,
        )
    c = cur.compute_per_step
    if cur.num_workers == 0:
        return _from_main_process(cur, cores, ok)
    k = cur.num_workers
    per_worker = k / cur.rate if cur.rate > 0 else math.inf  # one batch's load in a worker
    need = workers_for_step(per_worker, c, k)  # the loader model's (loadermodel.py)
    tried = {(t.num_workers, t.prefetch_factor) for t in trials}
    if need > k and k < cores and (min(need, cores), cur.prefetch_factor) not in tried:
        nk = min(need, cores)
        predicted = predict_rate(nk, per_worker, c, cores)
        cfg = {"num_workers": nk, "prefetch_factor": cur.prefetch_factor or 2}
        why = (
            f"still waiting {cur.wait_share:.0%} of the epoch: a worker loads a batch in "
            f"{per_worker * 1000:.0f} ms, a step computes in {c * 1000:.0f} ms: {nk} "
            f"workers should give {predicted:.1f} steps/s (now {cur.rate:.1f})"
        )
        return _checked(cfg, why, predicted, ok, cur)
    bound = _cpu_bound(cur, best, cores)
    if bound is not None:
        return bound
    if k < cores and (k, 4) not in tried and (cur.prefetch_factor or 2) < 4:
        cfg = {"num_workers": k, "prefetch_factor": 4}
        return _checked(
            cfg,
            f"still waiting {cur.wait_share:.0%} of the epoch with cores "
            f"to spare and more workers tried: more batches in flight "
            f"(prefetch_factor 4) for uneven ones",
            cur.rate,
            ok,
            cur,
        )
    # with a worker per usable core the CPU is the bound: batches in flight add no CPU
    # (measured on 2 cores, 2 workers: prefetch_factor 4 ran 3-5% slower than 2, median of 8
    # epochs each, benchmarks/bench_autotune.py's dataset)
    return Decision(
        None if best is cur else best.config(),
        f"no configuration left to try within {cores} core(s): keeping {_name(best)}",
        best.rate,
        done=True,
    )


def _cpu_bound(cur: EpochTrial, best: EpochTrial, cores: int) -> Decision | None:
    """Stop, keeping the best, when the trainer and its workers kept the usable cores busy:
    more batches in flight add no CPU; None otherwise."""
    busy = cur.cores_busy(cores)
    if busy is not None and busy >= CPU_BOUND_SHARE:
        return Decision(
            None if best is cur else best.config(),
            f"the trainer and its workers "
            f"kept {busy:.0%} of the {cores} usable core(s) busy at {_name(cur)}: "
            f"the CPU is the bound, more batches in flight add none; keeping "
            f"{_name(best)}",
            best.rate,
            done=True,
        )
    return None


def _from_main_process(
    cur: EpochTrial, cores: int, ok: Callable[[dict[str, Any]], str]
) -> Decision:
    """The first workers, from an epoch loading in the main process (num_workers=0): the
    fewest workers whose predicted rate is near the best's."""
    c = cur.compute_per_step
    load = cur.wait_per_step
    cpu = cur.cpu_per_step
    rates = {k: predict_rate(k, load, c, cores, cpu) for k in range(1, cores + 1)}
    top = max(rates.values())
    k = min(k for k, r in rates.items() if r >= NEAR_BEST * top)
    cfg = {"num_workers": k, "prefetch_factor": cur.prefetch_factor or 2}
    on_threads = (
        f" ({cpu * 1000:.0f} ms of CPU in all)" if cpu > THREADS_CPU_MARGIN * (load + c) else ""
    )
    why = (
        f"one batch loads in {load * 1000:.0f} ms in the main process and a step "
        f"computes in {c * 1000:.0f} ms{on_threads} on {cores} core(s): {k} worker(s) "
        f"should give {top:.1f} steps/s (now {cur.rate:.1f})"
    )
    return _checked(cfg, why, top, ok, cur)


def _tree_cpu() -> float:
    """CPU seconds of this process, of its children that ended (waited for: workers that shut
    down at the end of an epoch) and of those alive (the current workers)."""
    t = os.times()
    total = time.process_time() + t.children_user + t.children_system
    try:
        import psutil

        for ch in psutil.Process().children(recursive=True):
            try:
                c = ch.cpu_times()
            except psutil.Error:
                continue
            total += c.user + c.system
    except Exception:  # no psutil or no /proc: the trainer's own CPU only
        pass
    return total


def _best(trials: list[EpochTrial]) -> EpochTrial:
    """The fastest trial; of those within 1% of it, the first (the simpler configuration)."""
    top = max(t.rate for t in trials)
    return next(t for t in trials if t.rate >= 0.99 * top)


def _checked(
    cfg: dict[str, Any],
    why: str,
    predicted: float,
    fits: Callable[[dict[str, Any]], str],
    cur: EpochTrial,
) -> Decision:
    no = fits(cfg)
    if no:
        return Decision(None, f"{_short(cfg)} would not fit: {no}; keeping {_name(cur)}", done=True)
    return Decision(cfg, why, predicted)


def _short(cfg: dict[str, Any]) -> str:
    pf = cfg.get("prefetch_factor")
    return f"num_workers={cfg['num_workers']}" + (
        f", prefetch_factor={pf}" if pf and cfg["num_workers"] else ""
    )


def _name(t: EpochTrial) -> str:
    return _short(t.config())


# --- the tuner a watched loader carries ----------------------------------------------------------
@dataclass
class OnlineTuner:
    """Measures each epoch of one DataLoader and changes it before the next (see the module
    docstring). ``log(message)`` records a change in the run."""

    loader: Any
    log: Callable[[str], None] = lambda _m: None
    cores: int = 0
    max_trials: int = MAX_TRIALS
    state_path: Path | None = None
    trials: list[EpochTrial] = field(default_factory=list)
    changes: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False
    _pending: Decision | None = None
    _swap_in0: int = 0
    _cpu0: float = 0.0
    _tree0: float = 0.0
    _epoch: int = -1

    def __post_init__(self) -> None:
        if not self.cores:
            from stallscope.sources.cgroup import usable_cores

            self.cores = usable_cores()
        if self.state_path is None:
            from stallscope.store.paths import state_dir

            self.state_path = state_dir() / STATE_FILE
        if _iterable(getattr(self.loader, "dataset", None)):
            # every worker runs the whole __iter__ unless the dataset shards itself by worker
            # (get_worker_info()), which cannot be told from outside: more workers could
            # deliver each sample several times an epoch. The training sees what it wrote.
            self.done = True
            self.log(
                "autotune off: the loader's dataset is an IterableDataset, whose "
                "samples more workers would repeat unless it shards itself by worker; "
                "num_workers stays as written"
            )
            return
        from stallscope.probe import workererrors

        workererrors.install()  # a dataset's exception keeps its type in the workers we add
        kept = self._kept()
        if kept is not None and kept != self._current():
            self._apply(
                kept,
                f"the best configuration the last run of this loader found ({_short(kept)})",
                None,
            )

    # -- called by the watched loop ------------------------------------------------------------
    def before_epoch(self) -> None:
        """Apply the configuration decided after the last epoch; start measuring."""
        self._epoch += 1
        d, self._pending = self._pending, None
        if d is not None and d.config is not None:
            self._apply(d.config, d.why, d.predicted_rate)
        self._swap_in0 = swap_ins()
        self._cpu0 = time.process_time()
        self._tree0 = _tree_cpu()

    def after_epoch(
        self, steps: int, wall_s: float, wait_s: float, samples: int = 0, first_wait_s: float = 0.0
    ) -> None:
        """One epoch measured: decide the next configuration (never raises)."""
        if self.done or steps < 5 or wall_s <= 0:
            return
        cfg = self._current()
        predicted = (
            self.changes[-1]["predicted_steps_per_s"]
            if self.changes
            and self.changes[-1]["config"] == cfg
            and self.changes[-1]["epoch"] == self._epoch
            else None
        )
        t = EpochTrial(
            cfg["num_workers"],
            cfg["prefetch_factor"],
            steps,
            wall_s,
            wait_s,
            samples,
            predicted,
            min(first_wait_s, wait_s),
            max(0.0, time.process_time() - self._cpu0),
            max(0.0, _tree_cpu() - self._tree0),
        )
        self.trials.append(t)
        if predicted:
            err = t.rate / predicted - 1.0
            self.changes[-1].update(
                measured_steps_per_s=round(t.rate, 3), prediction_error=round(err, 3)
            )
            self.log(
                f"epoch {self._epoch} at {_name(t)}: {t.rate:.1f} steps/s measured, "
                f"{predicted:.1f} predicted ({err:+.0%}); data wait {t.wait_share:.0%}"
            )
        if swap_ins() > self._swap_in0 and len(self.trials) > 1:
            best = _best(self.trials[:-1])
            self._pending = Decision(
                best.config(),
                f"the host swapped during the epoch at {_name(t)}: back to {_name(best)}",
                best.rate,
                True,
            )
        else:
            self._pending = decide(
                self.trials, self.cores, max_trials=self.max_trials, fits=self._fits
            )
        if self._pending.done:
            self.done = True
            if self._pending.config is None:
                self.log(f"autotune done: {self._pending.why}")
            self._keep()

    def revert(self, exc: BaseException) -> bool:
        """The configuration set before this epoch failed before the epoch's first batch: go
        back to the one before it, stop tuning, and say why. False when this epoch's
        configuration is not autotune's (the failure is the training's own)."""
        last = self.changes[-1] if self.changes else None
        if last is None or last["epoch"] != max(self._epoch, 0) or last.get("reverted"):
            return False
        last["reverted"] = True
        self.done = True
        self._apply(
            last["from"],
            f"the loader failed at {_short(last['config'])} before the "
            f"epoch's first batch ({type(exc).__name__}: {str(exc)[:200]}): back to "
            "what worked, autotune off",
            None,
        )
        return True

    def best(self) -> dict[str, Any] | None:
        if not self.trials:
            return None
        b = _best(self.trials)
        return {
            **b.config(),
            "steps_per_s": round(b.rate, 3),
            "samples_per_s": round(b.samples / b.wall_s, 2) if b.wall_s and b.samples else None,
        }

    def summary(self) -> dict[str, Any]:
        """What the run keeps (``probes.config["autotune"]``)."""
        return {
            "trials": [
                dict(asdict(t), steps_per_s=round(t.rate, 3), wait_share=round(t.wait_share, 3))
                for t in self.trials
            ],
            "changes": self.changes,
            "best": self.best(),
            "done": self.done,
            "cores": self.cores,
        }

    # -- the loader ----------------------------------------------------------------------------
    def _current(self) -> dict[str, Any]:
        k = int(getattr(self.loader, "num_workers", 0) or 0)
        pf = getattr(self.loader, "prefetch_factor", None) if k else None
        return {"num_workers": k, "prefetch_factor": pf}

    def _apply(self, cfg: dict[str, Any], why: str, predicted: float | None) -> None:
        old = self._current()
        ld = self.loader
        k = int(cfg["num_workers"])
        try:
            it = getattr(ld, "_iterator", None)
            if it is not None:  # persistent workers: the next epoch must start new ones
                shutdown = getattr(it, "_shutdown_workers", None)
                if shutdown is not None:
                    shutdown()
                ld._iterator = None
            ld.num_workers = k
            ld.prefetch_factor = (cfg.get("prefetch_factor") or 2) if k else None
            if k and not getattr(ld, "pin_memory", False) and _gpu():
                ld.pin_memory = True
        except Exception as exc:  # a loader that refuses: stop tuning, say why
            self.done = True
            self.log(f"autotune stopped: cannot change the loader ({exc!r})")
            return
        new = self._current()
        self.changes.append(
            {
                "epoch": max(self._epoch, 0),
                "ts": time.time(),
                "from": old,
                "config": new,
                "why": why,
                "predicted_steps_per_s": round(predicted, 3) if predicted else None,
            }
        )
        self.log(f"before epoch {max(self._epoch, 0)}: {_short(old)} → {_short(new)}: {why}")

    def _fits(self, cfg: dict[str, Any]) -> str:
        k = int(cfg["num_workers"])
        if not k:
            return ""
        try:
            import psutil

            me = psutil.Process()
            kids = me.children()
            per = max((c.memory_info().rss for c in kids), default=me.memory_info().rss // 2)
            avail = psutil.virtual_memory().available + sum(c.memory_info().rss for c in kids)
        except Exception:
            return ""
        if k * per > MEM_SHARE * avail:
            return (
                f"{k} workers × {per / 2**20:,.0f} MiB > {MEM_SHARE:.0%} of "
                f"{avail / 2**20:,.0f} MiB available"
            )
        try:
            shm = shutil.disk_usage("/dev/shm").free
        except OSError:
            return ""
        # each worker's batches in flight go through /dev/shm: the loader model's one fit
        pf = cfg.get("prefetch_factor") or getattr(self.loader, "prefetch_factor", None) or 2
        if not shm_fits(shm_need_mib(k, int(pf)), shm / 2**20):
            return f"/dev/shm has {shm / 2**20:.0f} MiB free for {k} workers' batches"
        return ""

    # -- kept between runs ---------------------------------------------------------------------
    def signature(self) -> str:
        ld = self.loader
        ds = getattr(ld, "dataset", None)
        try:
            n = len(ds)  # type: ignore[arg-type]
        except Exception:
            n = -1
        script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "?"
        return (
            f"{type(ds).__module__}.{type(ds).__qualname__}|len={n}|"
            f"batch={getattr(ld, 'batch_size', None)}|{script}"
        )

    def _state(self) -> dict[str, Any]:
        """The state file's document: {} when absent, unreadable, not a regular file (a FIFO
        there would hold the training inside watch()), too big, or not an object."""
        from stallscope.safefile import read_bounded

        if self.state_path is None:
            return {}
        try:
            raw, more = read_bounded(self.state_path, MAX_STATE_BYTES)
            doc = None if more else json.loads(raw.decode("utf-8"))
        except (OSError, ValueError, RecursionError):
            return {}
        return doc if isinstance(doc, dict) else {}

    def _kept(self) -> dict[str, Any] | None:
        got = self._state().get(self.signature())
        if (
            not isinstance(got, dict)
            or not isinstance(got.get("num_workers"), int)
            or not 0 <= got["num_workers"] <= 4 * self.cores
        ):
            return None
        pf = got.get("prefetch_factor")
        return {
            "num_workers": got["num_workers"],
            "prefetch_factor": pf if isinstance(pf, int) and 1 <= pf <= 64 else 2,
        }

    def _keep(self) -> None:
        best = self.best()
        if best is None or self.state_path is None:
            return
        try:
            doc = self._state()
            doc[self.signature()] = {**best, "ts": time.time()}
            self.state_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.state_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(doc, indent=1))
            os.replace(tmp, self.state_path)
        except OSError as exc:
            self.log(f"could not keep the result in {self.state_path}: {exc}")


def _iterable(ds: Any) -> bool:
    """``ds`` is a torch ``IterableDataset`` (torch imported by the trainer)."""
    data = sys.modules.get("torch.utils.data")
    cls = getattr(data, "IterableDataset", None) if data is not None else None
    return cls is not None and isinstance(ds, cls)


def _gpu() -> bool:
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_available())
    except Exception:
        return False


def loader_call(cfg: dict[str, Any], given: dict[str, Any] | None = None) -> str:
    """``DataLoader(dataset, ...)`` with ``cfg`` over the loader's other arguments."""
    args = {
        k: v
        for k, v in (given or {}).items()
        if k in ("batch_size", "shuffle", "drop_last", "pin_memory", "persistent_workers")
        and v not in (None, False)
    }
    args.update({k: v for k, v in cfg.items() if k in ("num_workers", "prefetch_factor")})
    if not args.get("num_workers"):
        args.pop("prefetch_factor", None)
        args.pop("persistent_workers", None)
    return "DataLoader(dataset, " + ", ".join(f"{k}={v!r}" for k, v in args.items()) + ")"
