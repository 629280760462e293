"""tf.data fixes: what to change in a TensorFlow input pipeline, from the shape the probe recorded.

The TensorFlow adapter of the probe (:func:`stallscope.probe.keras.dataset_config`) keeps the
pipeline's knobs in the probe configuration (``loader_type`` ``"tf.data"``, ``sequential_maps``,
``prefetch``, ``cache``, ``interleave``, ``reads_files``, ``source_len``...). When a run is a
tf.data run, the input-bound findings name these fixes instead of DataLoader arguments. Pure
functions of the signals (and the run's recorded dataset size): docs/diagnosis.md lists them.
"""

from __future__ import annotations

from stallscope import units
from stallscope.analysis.diagnose.model import Fix, RunData
from stallscope.analysis.diagnose.rules.common import pack_command
from stallscope.analysis.facts import Facts
from stallscope.analysis.facts.build import BUSY_SPARE, spare_cores

__all__ = [
    "MANY_FILES",
    "is_tf",
    "tf_compute_fix",
    "tf_fetch_fixes",
    "tf_prep_estimate",
    "tf_prep_fixes",
]

#: files read one per element from which packing into shards is advised
MANY_FILES = 1000

_AUTO = "tf.data.AUTOTUNE"


def is_tf(fx: Facts) -> bool:
    """The probe saw a tf.data pipeline (the TensorFlow adapter recorded it)."""
    return fx.loader.config.get("loader_type") == "tf.data"


def _fits_in_ram(data: RunData, fx: Facts) -> str | None:
    """'36 MB < 5.1 GB available' when the dataset (``--data``) fits comfortably in RAM."""
    size = data.dataset_bytes
    avail = fx.host.mem_available_min_mib
    if size and avail and size / 1048576 < 0.5 * avail:
        return f"{units.size(size)} < {units.size(units.mib(avail))} available"
    return None


def _cache_fix(data: RunData, fx: Facts) -> list[Fix]:
    cfg = fx.loader.config
    fits = _fits_in_ram(data, fx)
    if cfg.get("cache") or fits is None:
        return []
    return [
        Fix(
            "add .cache() after the read/decode map (before random augmentation)",
            f"the dataset fits in memory ({fits}): after the first epoch every element "
            "comes from RAM instead of being read and decoded again",
        )
    ]


def _prefetch_fix(fx: Facts) -> list[Fix]:
    if fx.loader.config.get("prefetch"):
        return []
    return [
        Fix(
            f"end the pipeline with .prefetch({_AUTO})",
            "no prefetch in the pipeline: without one the next batch is only prepared "
            "while the step waits for it (TensorFlow may inject one on its own when the "
            "inject_prefetch optimization is on; an explicit one makes it certain)",
        )
    ]


def tf_prep_fixes(data: RunData, fx: Facts) -> list[Fix]:
    """Fixes for input_bound.prep in a tf.data run. A parallel map needs idle cores: when the
    CPUs were already busy (under a quarter of a core idle over the run), cheaper per-sample
    work comes first, as with DataLoader workers."""
    cfg = fx.loader.config
    fixes: list[Fix] = []
    seq = int(cfg.get("sequential_maps") or 0)
    cores = fx.host.physical_cores or fx.host.logical_cores
    busy = fx.host.host_cpu_median_pct
    spare = spare_cores(fx)
    cheaper = (
        "make per-sample work cheaper: decode at lower resolution, move augmentation into "
        "the model (Keras preprocessing layers run on the accelerator), or preprocess "
        "once offline and cache() the result"
    )
    if seq and busy is not None and spare is not None and spare < BUSY_SPARE:
        fixes.append(
            Fix(
                cheaper,
                f"the CPUs are already {busy:.0f}% busy: a parallel map "
                "would only share the same cores",
            )
        )
    if seq:
        fixes.append(
            Fix(
                f"map(..., num_parallel_calls={_AUTO}) on the {seq} map(s) without it",
                f"a map without num_parallel_calls transforms one element at a time "
                f"on one thread{f' ({cores} cores here)' if cores else ''}",
            )
        )
    fixes += _cache_fix(data, fx)
    fixes += _prefetch_fix(fx)
    if not seq:
        fixes.append(
            Fix(
                cheaper,
                "every map already runs in parallel"
                + (f" and the CPUs are {busy:.0f}% busy" if busy is not None else ""),
            )
        )
    return fixes


def tf_prep_estimate(fx: Facts, bound: float) -> float:
    """est_speedup of a tf.data prep stall: when maps run one element at a time, making them
    parallel adds at most the cores left idle over the run to the one the map uses now (×cores
    at most), and never more than removing the whole wait (``bound``); with no idle core, it
    adds nothing and the bound is cheaper work's."""
    cores = fx.host.physical_cores or fx.host.logical_cores
    spare = spare_cores(fx)
    if int(fx.loader.config.get("sequential_maps") or 0) and cores:
        if spare is None:
            return round(min(bound, float(cores)), 2)
        if spare >= BUSY_SPARE:
            return round(min(bound, float(cores), 1.0 + spare), 2)
    return bound


def tf_fetch_fixes(data: RunData, fx: Facts) -> list[Fix]:
    """Fixes for input_bound.fetch in a tf.data run (the device-level ones are shared)."""
    cfg = fx.loader.config
    fixes: list[Fix] = []
    files = cfg.get("source_len")
    many = isinstance(files, int) and files >= MANY_FILES and cfg.get("reads_files")
    if cfg.get("reads_files") and (
        int(cfg.get("sequential_maps") or 0) and not cfg.get("interleave")
    ):
        fixes.append(
            Fix(
                f"read files in parallel: map(read, num_parallel_calls={_AUTO}), or "
                f"interleave(..., num_parallel_calls={_AUTO}) over shards of the file "
                "list",
                "one read at a time cannot keep a storage device busy; "
                "parallel reads hide each read's latency",
            )
        )
    if many:
        cmd = pack_command(data)
        fixes.append(
            Fix(
                "pack the small files into shards read sequentially: "
                + (f"`{cmd}`" if cmd else "stallscope pack")
                + " "
                "(WebDataset tar shards, read from tf.data as docs/pack.md "
                "shows), or TFRecord shards (tf.io.TFRecordWriter) read with "
                f"tf.data.TFRecordDataset through interleave(..., num_parallel_calls="
                f"{_AUTO})",
                f"{files} files read one per element: each pays an open and a "
                "metadata lookup; shards are read sequentially in large requests",
            )
        )
    fixes += _cache_fix(data, fx)
    fixes += _prefetch_fix(fx)
    return fixes


def tf_compute_fix() -> Fix:
    """The healthy verdict's advice for a Keras run."""
    return Fix(
        "nothing to fix in the input pipeline; to go faster, make the model step "
        "cheaper (mixed precision: keras.mixed_precision.set_global_policy"
        "('mixed_float16'), a larger batch, model.compile(..., jit_compile=True))",
        "the step is compute time, not waiting",
    )
