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
)
