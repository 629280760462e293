"""The training itself: its steps (the probe, per rank) and where its training thread's
time went (sampled stacks, per process)."""

from __future__ import annotations

from stallscope.metrics.base import _M, Metric

TRAINING: tuple[Metric, ...] = (
    # --- probe: the trainer's steps, per rank (entity rank<N>), last 30 s (sources/steps.py), ---
    # for the alert engine of a run; not exported (the agent exports stallscope_train_* counters)
    _M(
        "probe",
        "wait_pct",
        "%",
        "share of step wall time the rank waited for data over the last "
        "30 s, sum(wait_s) / sum(wait_s + host_s) of the probe's steps",
        "gauge",
        "",
        0.01,
        label="rank",
    ),
    _M(
        "probe",
        "step_ms",
        "ms",
        "median step time of the rank over the last 30 s (probe wait_s + host_s)",
        "gauge",
        "",
        1e-3,
        label="rank",
    ),
    _M(
        "probe",
        "rank_slowdown",
        "",
        "the rank's median step time over the other ranks' median "
        "(last 30 s; 1 = as fast as the others)",
        "gauge",
        "",
        label="rank",
    ),
    _M(
        "probe",
        "peers_wait_pct",
        "%",
        "how much more of their step the other ranks spent in "
        "collectives than this rank over the last interval (the largest share among the others "
        "minus its own; DDP with communication timed)",
        "gauge",
        "",
        0.01,
        label="rank",
    ),
    _M(
        "probe",
        "waited_for",
        "",
        "1 while the other ranks wait for this rank in the "
        "all-reduce (a change in its peers' wait, or a gap of 15 points held; "
        "sources/straggler.py), else 0",
        "gauge",
        "",
        label="rank",
    ),
    # --- stacks: where the training thread's time went, from sampled stacks (per process; ---
    # sources/stacks/; docs/diagnosis.md): shares of the last 10 s of sampled training time;
    # for a run's alerts and `top`, and the agent's /metrics (agent/trainstacks.py)
    *(
        _M(
            "stacks",
            f"{phase}_pct",
            "%",
            f"share of the training thread's time {what}, from its sampled stacks",
            "gauge",
            f"stallscope_stacks_{phase}_ratio",
            0.01,
        )
        for phase, what in (
            ("data", "waiting for or loading data"),
            ("h2d", "copying to the device"),
            ("compute", "computing (forward, backward, optimizer)"),
            ("gpu_wait", "waiting for the GPU (synchronize, .item())"),
            ("comm", "in collective communication"),
            ("ckpt", "in checkpoint I/O"),
            ("graph", "inside a compiled TensorFlow function"),
            ("other", "elsewhere"),
        )
    ),
    _M(
        "stacks",
        "sampled_s",
        "s",
        "seconds of training time the samples of the interval stand "
        "for (start-up left out; the last 10 s)",
        "gauge",
        "stallscope_stacks_sampled_seconds",
    ),
    # --- the trainer's loader threads over the same 10 s (the records' ``threads`` part, ------
    # sources/stacks/threads.py); the agent alone exports them (agent/trainstacks.py), for
    # ``diagnose --prometheus``'s thread-loader and GIL facts
    _M(
        "stacks",
        "loader_threads",
        "",
        "the trainer's loader threads that worked (fetched or prepared) in one "
        "record of the last 10 s, the most of them",
        "gauge",
        "stallscope_stacks_loader_threads",
    ),
    *(
        _M(
            "stacks",
            f"loader_{phase}_s",
            "s",
            f"thread-seconds the trainer's loader threads spent {what} over the last 10 s, "
            "from their sampled stacks",
            "gauge",
            f"stallscope_stacks_loader_{phase}_seconds",
        )
        for phase, what in (
            ("fetch", "reading (files, sockets, object stores)"),
            ("prep", "preparing (decoding, transforms, their own Python)"),
            ("idle", "waiting for work or for room in the queue"),
        )
    ),
    _M(
        "stacks",
        "loader_cpu_s",
        "s",
        "CPU seconds the loader threads that worked used over the last 10 s (their "
        "per-thread CPU clocks)",
        "gauge",
        "stallscope_stacks_loader_cpu_seconds",
    ),
    _M(
        "stacks",
        "loader_wait_s",
        "s",
        "seconds the training thread waited on its loader threads (queue.get, "
        "Future.result) over the last 10 s",
        "gauge",
        "stallscope_stacks_loader_wait_seconds",
    ),
    _M(
        "stacks",
        "gil_wait_s",
        "s",
        "seconds the in-process sampler waited for the GIL over its wakes of the last 10 s "
        "(its lateness waking less its run-queue wait); divided by stacks.gil_wakes, the "
        "GIL wait per wake (input_bound.gil)",
        "gauge",
        "stallscope_stacks_gil_wait_seconds",
    ),
    _M(
        "stacks",
        "gil_wakes",
        "",
        "the in-process sampler's wakes that stacks.gil_wait_s is measured over (last 10 s)",
        "gauge",
        "stallscope_stacks_gil_wakes",
    ),
)
