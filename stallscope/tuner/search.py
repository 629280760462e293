"""The search: which configurations to try, in which order, and when to stop.

1. The configuration as given (the baseline), then the training step alone on one batch (the
   consumer's rate), when a step is given.
2. ``num_workers``, predicted then verified. A baseline without workers predicts one worker;
   one worker's trial is then measured (always: it calibrates the model) and gives a sample's
   load time in a worker ``L`` (1 / its rate while the step waits for it) and the loading CPU
   per sample ``Lc``; the step gives ``c`` per sample, and the trainer's CPU per sample beside
   the loading ``M`` (the step on all its threads, receiving batches: the trial's CPU less
   ``Lc``, at least ``c``). After a baseline without workers, the step's bound is its time
   as measured beside that worker, ``s`` (its threads share the cores with the loading).
   ``k`` workers then feed ``min(k / L, 1 / s, cores / (Lc + M), R / b)`` samples/s (a
   resource model in the spirit of Plumber, MLSys'22: loading in parallel, the step in series,
   both on the usable cores, the storage at ``R`` bytes/s, the read limit of this process's
   cgroup on a device the trial read from, over ``b`` bytes read per sample).
   The fewest workers within 2% of the best prediction are tried, and the prediction error is
   noted; when they fall more than 5% short, the shortfall fits the workers' contention and the
   next prediction is tried (at most three rounds). Then the runner-up: the untried count the
   model predicts next best, when within 10% of its best prediction (fewer workers, or more
   only where predicted faster); its error is noted too. Without a prediction (the one-worker
   trial failed), the ladder 1, 2, 4, 8 … capped at the usable cores, stopping once the input
   keeps up (data wait under 5%) or a step up gains under 5%, then one trial between the best
   and an untried neighbour.
3. At the best worker count: ``prefetch_factor`` 4 (then 8 if 4 helped; not while the usable
   cores are busy or the reads are at the read limit), ``pin_memory`` when a GPU
   is present, and any batch sizes asked for. ``persistent_workers`` needs no trial: the worker
   start-up measured in every trial is what it saves per epoch, at no cost but memory.

Before each trial the memory a configuration would need (this process plus one worker's RSS per
worker, as measured) is checked against what the machine has available; a configuration that
would not fit is rejected with the figures. A trial clearly slower than the best so far is cut
short, so a poor configuration costs half a window, not a whole one.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from typing import Any

import psutil

from stallscope import units
from stallscope.loadermodel import (
    ALIKE,
    AT_READ_LIMIT,
    CPU_BOUND_SHARE,
    KEEPS_UP_PACE,
    MEM_SHARE,
    MIN_GAIN,
    NEAR_BEST,
    OTHERS_BUSY_CORES,
    alike,
    gains,
    keeps_up,
    rate,
    shm_fits,
    shm_need_mib,
)
from stallscope.sources.cgroup import read_caps as host_read_caps
from stallscope.sources.cgroup import usable_cores
from stallscope.tuner.measure import Overtime, Trial, others_cores, run_trial, taking_others
from stallscope.tuner.outcome import TuneResult, _r, bound_text, tree_share
from stallscope.tuner.target import Target, batch_nbytes, call_text, gpu_present, is_iterable

#: the model's runner-up is tried when predicted within this share of its best prediction
RUNNER_UP = 0.9


Progress = Callable[[str, float], None]
#: runs one trial: (config, window_s, best rate so far) -> its Trial
Measure = Callable[[dict[str, Any], float, "float | None"], Trial]


class Search:
    """Runs the trials of one tuning within a time budget."""

    def __init__(
        self,
        target: Target,
        *,
        step_fn: Callable[[Any], Any] | None,
        budget_s: float,
        max_workers: int | None,
        start_method: str | None,
        batch_sizes: tuple[int, ...] = (),
        progress: Progress | None = None,
        gpu: bool | None = None,
        cores: int | None = None,
        measure: Measure | None = None,
        step_ms: float | None = None,
        read_caps: dict[str, int] | None = None,
    ) -> None:
        self.target = target
        self.step_fn = step_fn
        self.budget_s = budget_s
        self.cores = cores or usable_cores()
        #: runs one trial: real (run_trial) unless a simulation gives its own
        self.measure: Measure = measure or (
            lambda config, window_s, best_rate: run_trial(
                self.target.make,
                config,
                window_s=window_s,
                step_fn=self.step_fn,
                best_rate=best_rate,
            )
        )
        self._given_step_ms = step_ms
        #: bytes/s this process may read per device (its cgroup's I/O limit; a simulation
        #: gives its own)
        self.read_caps = host_read_caps() if read_caps is None else read_caps
        #: what the model predicted per worker count (samples/s), when it could
        self.predicted: dict[int, float] = {}
        #: the rate predicted for a worker count before its trial measured it (the first
        #: prediction each count got after the calibration trial), for the predicted speed-up
        self.forecast: dict[int, float] = {}
        self.max_workers = (
            max(0, min(max_workers, self.cores)) if max_workers is not None else self.cores
        )
        self.start_method = start_method
        self.batch_sizes = batch_sizes
        self.progress = progress or (lambda _label, _done: None)
        self.gpu = gpu_present() if gpu is None else gpu
        self._iterable = is_iterable(target)
        # a window per trial such that about a dozen trials fit the budget
        self.window_s = min(10.0, max(1.0, budget_s / 14))
        self.trials: list[Trial] = []
        self.t0 = time.monotonic()
        self.step_ms: float | None = None
        self.stopped = ""
        self.notes: list[str] = []
        self.interrupted = False

    # -- bookkeeping ---------------------------------------------------------------------------

    def _left(self) -> float:
        return self.budget_s - (time.monotonic() - self.t0)

    #: a trial chosen over the fastest one as its equal within the noise, but lighter
    preferred: Trial | None = None

    def _best(self) -> Trial | None:
        if self.preferred is not None:
            return self.preferred
        ok = [t for t in self.trials if _eligible(t)]
        return max(ok, key=lambda t: t.samples_per_s or 0.0) if ok else None

    def _tried(self, config: dict[str, Any]) -> Trial | None:
        for t in self.trials:
            if t.config == config:
                return t
        return None

    def _config(self, **kw: Any) -> dict[str, Any]:
        base = dict(self.target.given)
        base.update(kw)
        if base.get("num_workers", 0) > 0:
            if self.start_method:
                base["multiprocessing_context"] = self.start_method
            # a worker that hangs becomes an error naming the configuration, never a hang
            base["timeout"] = max(60.0, 6 * self.window_s)
        else:
            for k in (
                "prefetch_factor",
                "persistent_workers",
                "multiprocessing_context",
                "timeout",
            ):
                base.pop(k, None)
        return base

    def _fits(self, config: dict[str, Any]) -> str:
        """Empty when ``config`` fits in memory; otherwise why not."""
        workers = config.get("num_workers", 0)
        per_worker = max((t.worker_rss_mib or 0.0) for t in self.trials) if self.trials else 0.0
        if not workers or not per_worker:
            return ""
        me = psutil.Process().memory_info().rss / 2**20
        need = me + workers * per_worker
        avail = psutil.virtual_memory().available / 2**20 + me
        if need > MEM_SHARE * avail:
            return (
                f"would need ~{need:,.0f} MiB ({workers} workers × {per_worker:,.0f} MiB + "
                f"{me:,.0f} MiB), {avail:,.0f} MiB available"
            )
        try:
            shm_free = shutil.disk_usage("/dev/shm").free / 2**20
        except OSError:
            return ""
        shm_need = shm_need_mib(workers, config.get("prefetch_factor", 2), self._batch_mib)
        if not shm_fits(shm_need, shm_free):  # the loader model's one fit (loadermodel.py)
            return (
                f"would keep ~{shm_need:,.0f} MiB of batches in /dev/shm, {shm_free:,.0f} MiB free"
            )
        return ""

    _batch_mib: float | None = None
    #: samples/s the cgroup's read limit lets through (None: no limit applies)
    storage_bound: float | None = None

    def _trial(self, label: str, config: dict[str, Any]) -> Trial | None:
        """Run one trial unless already tried, out of budget, or too big for memory."""
        seen = self._tried(config)
        if seen is not None:
            return seen
        if self.trials and self._left() < self.window_s * 1.2:
            if not self.stopped:
                self.stopped = f"the {self.budget_s:g} s budget ran out"
            return None
        why = self._fits(config)
        if why:
            t = Trial(config=config, status="rejected", reason=why)
            self.trials.append(t)
            return t
        self.progress(label, time.monotonic() - self.t0)
        best = self._best()
        t = self.measure(config, self.window_s, best.samples_per_s if best else None)
        if t.swap_in:
            t.reason = (
                t.reason + "; " if t.reason else ""
            ) + f"the machine swapped in {units.size(t.swap_in)} during the trial: not recommended"
        if others_cores(t) >= OTHERS_BUSY_CORES:
            names = ", ".join(
                f"{b['name']} (pid {b['pid']}, {b['cores']:.1f})" for b in taking_others(t)[:3]
            )
            t.reason = (
                t.reason + "; " if t.reason else ""
            ) + f"ran beside other processes keeping {others_cores(t):.1f} cores busy: {names}"
        self.trials.append(t)
        return t

    # -- the search ----------------------------------------------------------------------------

    def run(self) -> TuneResult:
        try:
            self._search()
        except KeyboardInterrupt as exc:
            self.interrupted = True
            self.stopped = (
                f"{exc}: the best configuration found so far"
                if isinstance(exc, Overtime)
                else "interrupted by Ctrl-C: the best configuration found so far"
            )
        return self._result()

    def _keeps_up(self, t: Trial | None) -> bool:
        """The input keeps up with the step in ``t``, and ``t`` is as fast as the best: a low
        data wait because the step itself slowed (workers taking its cores) does not count."""
        if t is None or not _eligible(t) or not keeps_up(t.data_wait_share):
            return False
        best = self._best()
        return best is None or (t.samples_per_s or 0.0) >= KEEPS_UP_PACE * (
            best.samples_per_s or 0.0
        )

    def _failed(self, t: Trial) -> bool:
        """``t`` failed: stop the search, saying the dataset must work in workers first."""
        if t.status != "failed":
            return False
        self.stopped = (
            f"num_workers={t.config.get('num_workers', 0)} failed ({t.reason}): the "
            "dataset must work in worker processes before more workers can help"
        )
        return True

    def _stop_if_keeps_up(self, t: Trial) -> bool:
        """The input keeps up at ``t``: stop the search, saying so, and recommend ``t`` (the
        configuration the stop names), also where a trial without that pace measured up to
        ``1 - KEEPS_UP_PACE`` faster (its wait says the step was slowed or the loader lags)."""
        if not self._keeps_up(t):
            return False
        self.stopped = (
            f"the input keeps up with the training step at num_workers="
            f"{t.config.get('num_workers', 0)} (data wait "
            f"{100 * (t.data_wait_share or 0):.1f}%): more tuning cannot help"
        )
        fastest = self._best()
        if fastest is not None and fastest is not t:
            self.preferred = t
            self.notes.append(
                f"num_workers={t.config.get('num_workers', 0)} keeps up (data wait "
                f"{100 * (t.data_wait_share or 0):.1f}%) at {t.samples_per_s or 0:,.0f} "
                f"samples/s, within {1 - KEEPS_UP_PACE:.0%} of num_workers="
                f"{fastest.config.get('num_workers', 0)} ({fastest.samples_per_s or 0:,.0f} "
                f"samples/s, data wait {100 * (fastest.data_wait_share or 0):.1f}%): the "
                "configuration the input keeps up at is recommended"
            )
        return True

    def _search(self) -> None:
        base = self._trial("baseline (as given)", self._config())
        if base is None or base.status == "failed":
            self.stopped = "the configuration as given failed"
            return
        try:
            self._measure_step()
        except Exception as exc:
            self.stopped = f"the training step failed on a batch: {type(exc).__name__}: {exc}"
            return
        if self._keeps_up(base):
            self.stopped = (
                "the input already keeps up with the training step as given: "
                "more tuning cannot help"
            )
            return
        self._predict_workers()
        if self.stopped:
            return
        best = self._best()
        if best is None:
            return
        w = best.config.get("num_workers", 0)
        if w > 0 and self._cpu_bound(best):
            # every usable core busy loading or stepping: batches in flight add no CPU
            # (docs/tune.md, "What the tuner's rules rest on")
            self.notes.append(
                f"prefetch_factor not tried: {_short(best.config)} keeps the "
                f"{self.cores} usable cores {tree_share(best, self.cores):.0%} busy"
            )
        elif (
            w > 0
            and self.storage_bound
            and (best.samples_per_s or 0.0) >= AT_READ_LIMIT * self.storage_bound
        ):
            self.notes.append(
                f"prefetch_factor not tried: {_short(best.config)} reads at the "
                "cgroup's read limit already"
            )
        elif w > 0 and not self._keeps_up(best):
            pf = best.config.get("prefetch_factor", 2)
            for factor in (4, 8):
                if factor <= pf:
                    continue
                before = self._best()
                t = self._trial(
                    f"num_workers={w} prefetch_factor={factor}",
                    self._config(num_workers=w, prefetch_factor=factor),
                )
                if t is None or self.stopped or self._keeps_up(t):
                    break
                if before is None or (t.samples_per_s or 0.0) < MIN_GAIN * (
                    before.samples_per_s or 0.0
                ):
                    break  # more batches in flight did not help: no further
        best = self._best()
        if best is not None and self.gpu and not best.config.get("pin_memory"):
            self._trial("pin_memory=True", {**best.config, "pin_memory": True})
        for bs in self.batch_sizes:
            best = self._best()
            if best is None or self.stopped:
                break
            self._trial(f"batch_size={bs}", {**best.config, "batch_size": bs})
        self._confirm()
        if not self.stopped:
            self.stopped = "every candidate worth trying was tried"

    def _confirm(self) -> None:
        """Measure the best and a runner-up within 15% of it once more each for half a window
        (runner-up first), back to back, and keep the time-weighted averages: one window is a
        noisy figure, and a close call decided by noise costs more than the one window this
        takes. A lighter runner-up still within ``ALIKE`` of the best after that is
        recommended: alike within the noise (docs/tune.md, "What the tuner's rules rest
        on")."""
        best = self._best()
        if best is None or not best.samples_per_s:
            return
        rivals = [
            t
            for t in self.trials
            if t.status == "ok"
            and t is not best
            and t.samples_per_s
            and t.samples_per_s >= 0.85 * best.samples_per_s
            and t.swap_in == 0
        ]
        if not rivals:
            return
        rival = max(rivals, key=lambda t: t.samples_per_s or 0.0)
        close = alike(rival.samples_per_s or 0.0, best.samples_per_s)
        if close and _weight(rival.config) >= _weight(best.config):
            return  # the best is the lighter one as well
        again_s = max(1.0, self.window_s / 2)
        if self._left() < 2.2 * again_s:
            if close:
                self._prefer_lighter(rival, best)
            else:
                self.notes.append(
                    f"{_short(rival.config)} came within 15% of the best; the "
                    "budget left no time to measure both again"
                )
            return
        for t in (rival, best):
            self.progress(f"again: {_short(t.config)}", time.monotonic() - self.t0)
            again = self.measure(t.config, again_s, None)
            if again.status == "ok":
                t.merge(again)
        hi, lo = sorted((rival, best), key=lambda t: t.samples_per_s or 0.0, reverse=True)
        self.notes.append(
            f"close call measured twice: {_short(hi.config)} {hi.samples_per_s or 0:,.0f} vs "
            f"{_short(lo.config)} {lo.samples_per_s or 0:,.0f} samples/s (over "
            f"{hi.seconds:.1f} and {lo.seconds:.1f} s)"
        )
        if (lo.samples_per_s or 0.0) >= ALIKE * (hi.samples_per_s or 0.0) and _weight(
            lo.config
        ) < _weight(hi.config):
            self._prefer_lighter(lo, hi)

    def _prefer_lighter(self, light: Trial, heavy: Trial) -> None:
        self.preferred = light
        self.notes.append(
            f"{_short(light.config)} ran within {1 - ALIKE:.0%} of "
            f"{_short(heavy.config)}: alike within the measurements' noise, the "
            "lighter one is recommended"
        )

    def _measure_step(self) -> None:
        """The step's time on one batch (repeated): the consumer's rate; and a batch's size."""
        if self._given_step_ms is not None:  # a simulation knows it
            self.step_ms = self._given_step_ms
            return
        loader = self.target.make(**self._config(num_workers=0))
        batch = next(iter(loader))
        self._batch_mib = batch_nbytes(batch) / 2**20
        if self.step_fn is None:
            return
        base = self.trials[0] if self.trials else None
        if (
            base is not None
            and base.status == "ok"
            and not base.config.get("num_workers")
            and base.step_ms
            and base.batches >= 10
        ):
            # the baseline loaded in the main process, between steps: its steps ran alone, as
            # the step on a batch does here, so its figure is that one (a window saved)
            self.step_ms = base.step_ms
            return
        self.step_fn(batch)  # warm-up
        times: list[float] = []
        t_end = time.perf_counter() + min(2.0, self.window_s)
        while time.perf_counter() < t_end or len(times) < 3:
            a = time.perf_counter()
            self.step_fn(batch)
            times.append(time.perf_counter() - a)
            if len(times) >= 200:
                break
        times.sort()
        self.step_ms = 1000.0 * times[len(times) // 2]

    def _predict_workers(self) -> None:
        """Predict each worker count's rate, try the predicted best; if it falls short of its
        prediction, fit the workers' contention from what it measured and predict again (at
        most three rounds); then the runner-up. See the module docstring, step 2."""
        if self.max_workers < 1:
            return
        self._predict_rounds()
        if not self.stopped:
            self._try_runner_up()

    def _try_runner_up(self) -> None:
        """The worker count the model predicts next best, untried, when its prediction is
        within ``RUNNER_UP`` of the best one: measured once, its prediction error noted. Where
        two counts are predicted that close, the model's own error decides between them (on 2
        cores the step slows beside the workers by more than it knows); one window settles it."""
        rates = self.predicted
        if not rates:
            return
        top = max(rates.values())
        best = min(w for w, r in rates.items() if r >= NEAR_BEST * top)
        # more workers than the best only where predicted faster: where they are not, the
        # bound they share (the step, the cores, the read limit) does not move with workers
        untried = {
            w: r
            for w, r in rates.items()
            if self._tried(self._config(num_workers=w)) is None and (w < best or r > rates[best])
        }
        if not untried:
            return
        w = max(untried, key=lambda n: (untried[n], -n))  # ties: the fewer workers
        if untried[w] < RUNNER_UP * top:
            return
        self.forecast.setdefault(w, untried[w])
        t = self._trial(
            f"num_workers={w} (runner-up, predicted {untried[w]:,.0f} samples/s)",
            self._config(num_workers=w),
        )
        if t is None or t.status != "ok" or not t.samples_per_s:
            return
        err = t.samples_per_s / untried[w] - 1.0
        self.notes.append(
            f"runner-up: predicted {untried[w]:,.0f} samples/s at num_workers="
            f"{w}; measured {t.samples_per_s:,.0f} ({err:+.0%})"
        )

    def _predict_rounds(self) -> None:
        base = self.trials[0] if self.trials else None
        zero = (
            base
            if base is not None
            and base.status == "ok"
            and not base.config.get("num_workers")
            and base.samples_per_s
            else None
        )
        # from the baseline alone (no workers: the trainer loaded every batch itself)
        first = self._model(zero) if zero is not None else {}
        if first:
            self.predicted = first
        one = self._trial(
            "num_workers=1" + (f" (predicted {first[1]:,.0f} samples/s)" if first else ""),
            self._config(num_workers=1),
        )
        if one is None:
            return
        if self._failed(one):
            return
        if first and one.status == "ok" and one.samples_per_s:
            self.notes.append(
                f"predicted {first[1]:,.0f} samples/s at num_workers=1 from the "
                f"baseline; measured {one.samples_per_s:,.0f} "
                f"({one.samples_per_s / first[1] - 1.0:+.0%})"
            )
        if self._stop_if_keeps_up(one):
            return
        # from here on, the baseline and the one worker's trial together
        contention = 0.0
        for _round in range(3):
            rates = self._model(one, contention, zero=zero)
            if not rates:
                self._climb_workers()
                return
            self.predicted = rates
            top = max(rates.values())
            k = min(w for w, r in rates.items() if r >= NEAR_BEST * top)
            if self._tried(self._config(num_workers=k)) is not None:
                return  # the model points where it measured already
            self.forecast.setdefault(k, rates[k])
            t = self._trial(
                f"num_workers={k} (predicted {rates[k]:,.0f} samples/s)",
                self._config(num_workers=k),
            )
            if t is not None and self._failed(t):
                return
            if t is None or t.status != "ok" or not t.samples_per_s:
                return
            err = t.samples_per_s / rates[k] - 1.0
            self.notes.append(
                f"predicted {rates[k]:,.0f} samples/s at num_workers={k}; "
                f"measured {t.samples_per_s:,.0f} ({err:+.0%})"
            )
            if self._stop_if_keeps_up(t):
                return
            if err >= -0.05 or k <= 1:
                return  # the prediction held
            # k workers fell short: each one slows the others' loading by a share δ
            # (k / (L (1 + δ (k - 1))) = measured), the model's one unknown
            load = self._load_s(one)
            if not load:
                return
            contention = max(0.0, (k / (t.samples_per_s * load) - 1.0) / (k - 1))

    def _load_s(self, source: Trial) -> float:
        """Seconds to load one sample in one worker, from the trial the model starts from."""
        if not source.samples_per_s:
            return 0.0
        if source.config.get("num_workers"):
            return 1.0 / source.samples_per_s
        per_batch = source.samples / source.batches if source.batches else 0
        c = (self.step_ms or 0.0) / 1000.0 / per_batch if per_batch and self.step_ms else 0.0
        return max(1.0 / source.samples_per_s - c, 1e-9)

    def _model(
        self, source: Trial, contention: float = 0.0, *, zero: Trial | None = None
    ) -> dict[int, float]:
        """Samples/s per worker count (module docstring), from ``source`` (the baseline at
        no workers, or one worker's trial) and the contention fitted so far; {} when the trial
        does not tell a sample's load time. With one worker's trial after a baseline without
        workers (``zero``), the step's time is the one measured beside that worker."""
        if source.status != "ok" or not source.samples_per_s or source.samples_per_s <= 0:
            return {}
        load = self._load_s(source)
        per_batch = source.samples / source.batches if source.batches else 0
        c = (self.step_ms or 0.0) / 1000.0 / per_batch if per_batch and self.step_ms else 0.0
        if source.config.get("num_workers"):
            cpu = (source.cpu_ms_per_sample or 0.0) / 1000.0 or load
        else:  # the whole process's CPU: loading and the step
            cpu = max((source.cpu_ms_per_sample or 0.0) / 1000.0 - c, 0.0) or load
        cpu = min(cpu, load)
        # the trainer's own CPU per sample beside the loading: the step on all its threads
        # (torch uses every core) and receiving batches; at least the step's time on one
        # thread
        total = (source.cpu_pct or 0.0) / 100.0 / source.samples_per_s
        main = max(total - cpu, c)
        step = c
        if zero is not None and source.config.get("num_workers") and source.step_ms and per_batch:
            # the step as it ran beside a worker: its threads share the cores with the loading;
            # the trainer's CPU per sample stays the one measured there (its threads spinning
            # for the cores included)
            step = max(c, source.step_ms / 1000.0 / per_batch)
        storage = self._storage_bound(source)
        return {
            w: rate(
                w,
                load,
                cores=self.cores,
                step_s=step,
                cpu_s=cpu,
                main_cpu_s=main,
                contention=contention,
                storage=storage,
            )
            for w in range(1, self.max_workers + 1)
        }

    def _storage_bound(self, source: Trial) -> float | None:
        """Samples/s the storage lets through: the read limit of this process's cgroup on a
        device the trial read from, over the bytes read per sample. None without a limit
        (a device's own throughput is not known without a benchmark of it)."""
        caps = [self.read_caps[d] for d in source.read_devices if d in self.read_caps]
        b = source.read_bytes_per_sample or 0.0
        if not caps or b <= 0:
            return None
        bound = self.storage_bound = min(caps) / b
        if not any(n.startswith("reads are capped") for n in self.notes):
            self.notes.append(
                f"reads are capped at {min(caps) / 1e6:,.1f} MB/s (the cgroup's "
                f"I/O limit) and a sample reads {b / 1e3:,.1f} kB: at most "
                f"{bound:,.0f} samples/s whatever the workers"
            )
        return bound

    def _climb_workers(self) -> None:
        ladder = [w for w in (1, 2, 4, 8, 16, 32, 64, 128) if w < self.max_workers]
        if self.max_workers >= 1:
            ladder.append(self.max_workers)
        # one worker does the same work as the trainer without workers, so the first rung
        # is not judged against the baseline: climbing stops when a rung gains under 5% on
        # the rung below it
        prev: Trial | None = None
        for w in ladder:
            t = self._trial(f"num_workers={w}", self._config(num_workers=w))
            if t is None:
                return
            if self._failed(t):
                return
            if self._stop_if_keeps_up(t):
                return
            if prev is None and t.status == "ok":
                prev = t
                continue
            if (
                t.status != "ok"
                or not t.samples_per_s
                or prev is None
                or not prev.samples_per_s
                or not gains(t.samples_per_s, prev.samples_per_s)
            ):
                if t.step_ms and self.step_ms and t.step_ms > 1.3 * self.step_ms:
                    self.notes.append(
                        f"at num_workers={w} the training step slowed from {self.step_ms:.0f} "
                        f"to {t.step_ms:.0f} ms per batch: the workers take the step's cores"
                    )
                break
            prev = t
        # one trial between the best and an untried neighbour
        best = self._best()
        if best is None:
            return
        bw = best.config.get("num_workers", 0)
        tried = sorted({t.config.get("num_workers", 0) for t in self.trials})
        higher = [w for w in tried if w > bw]
        if higher and higher[0] - bw > 1:
            mid = (bw + higher[0]) // 2
            self._trial(f"num_workers={mid}", self._config(num_workers=mid))
        lower = [w for w in tried if w < bw]
        if lower and bw - lower[-1] > 1 and self._best() is best:
            mid = (bw + lower[-1]) // 2
            self._trial(f"num_workers={mid}", self._config(num_workers=mid))

    # -- the outcome ---------------------------------------------------------------------------

    def _result(self) -> TuneResult:
        base = self.trials[0] if self.trials else None
        best = self._best()  # None when nothing ran: then nothing is recommended
        best_cfg = _public(best.config) if best else {}
        if best is not None and best_cfg.get("num_workers", 0) > 0 and self._iterable:
            self.notes.append(
                "an IterableDataset must split its stream between workers (torch.utils.data."
                "get_worker_info()), or every worker yields every item and the samples/s "
                "above count duplicates"
            )
        if best is not None and best_cfg.get("num_workers", 0) > 0:
            best_cfg["persistent_workers"] = True
            best_cfg.setdefault("prefetch_factor", 2)
            if best.startup_s is not None and best.startup_s >= 0.05:
                self.notes.append(
                    f"persistent_workers=True keeps the workers between epochs: saves the "
                    f"{best.startup_s:.2f} s worker start-up measured at the start of each epoch"
                )
        busy = [t for t in self.trials if t.status == "ok" and others_cores(t) >= OTHERS_BUSY_CORES]
        if busy:
            most = max(busy, key=others_cores)
            self.notes.append(
                f"{len(busy)} of the trials ran beside other processes (up to "
                f"{others_cores(most):.1f} cores busy, {taking_others(most)[0]['name']} first): "
                "their rates are lower than on a quiet host and the recommendation may differ "
                "there; run stallscope tune again when the host is quiet"
            )
        baseline = {
            "config": _public(base.config) if base else {},
            "samples_per_s": _r(base.samples_per_s) if base else None,
            "data_wait_share": _r(base.data_wait_share) if base else None,
        }
        k = best_cfg.get("num_workers", 0)
        predicted_speedup = None
        if k in self.forecast and base is not None and base.samples_per_s:
            predicted_speedup = self.forecast[k] / base.samples_per_s
        return TuneResult(
            predicted_speedup=predicted_speedup,
            best=best_cfg,
            samples_per_s=best.samples_per_s if best else None,
            baseline=baseline,
            trials=self.trials,
            best_index=self.trials.index(best) if best is not None else None,
            recommendation=call_text(self.target, best_cfg) if best else "",
            bound=self._bound(best),
            stopped=self.stopped,
            step_ms=self.step_ms,
            cores=self.cores,
            budget_s=self.budget_s,
            seconds=time.monotonic() - self.t0,
            interrupted=self.interrupted,
            notes=self.notes,
        )

    def _bound(self, best: Trial | None) -> str:
        """What bounds ``best``, in words (:func:`~stallscope.tuner.outcome.bound_text`)."""
        return bound_text(
            best,
            self.trials,
            keeps_up=self._keeps_up(best),
            step_ms=self.step_ms,
            cores=self.cores,
            max_workers=self.max_workers,
        )

    def _cpu_bound(self, t: Trial) -> bool:
        return tree_share(t, self.cores) >= CPU_BOUND_SHARE


def _eligible(t: Trial) -> bool:
    """``t`` ran whole and may be recommended: measured a rate, and nothing swapped in."""
    return t.status == "ok" and bool(t.samples_per_s) and t.swap_in == 0


def _weight(config: dict[str, Any]) -> tuple[int, int]:
    """What a configuration costs: workers, then batches in flight."""
    w = int(config.get("num_workers", 0) or 0)
    return w, w * int(config.get("prefetch_factor", 2) or 2)


def _short(config: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in _public(config).items())


def _public(config: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments to recommend: the internal time-out and start method left out."""
    return {k: v for k, v in config.items() if k not in ("timeout", "multiprocessing_context")}
