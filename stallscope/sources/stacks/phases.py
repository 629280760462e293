"""Phases from frames: what a training thread was doing, read off one sample of its stack.

A sample is the thread's Python frames, innermost first, each ``(file, function, line)``. The
phase is decided by the innermost frame that a framework's table knows (:data:`TABLES`, one
table per framework, documented in docs/diagnosis.md): a frame in
``torch/utils/data/dataloader.py`` means the step is waiting for its batch, whatever user code
(a ``__getitem__`` with ``num_workers=0``) runs inside it; a frame in ``torch/nn/modules/``
means compute. A C call has no frame of its own, so when the innermost frame is the trainer's
own code, its source line is read too (:data:`LINE_PATTERNS`): ``x.to(device)`` is a copy to
the device, ``loss.item()`` waits for the GPU. Pure: no I/O but :mod:`linecache` for source
lines, and a memo, since a training loop repeats a handful of stacks.

The phases (:data:`PHASES`): ``data`` (waiting for the next batch, or loading it on the
training thread), ``h2d`` (host→device copy), ``compute`` (forward, backward, optimizer),
``gpu_wait`` (synchronize, ``.item()``, ``.cpu()``), ``comm`` (collective communication),
``ckpt`` (checkpoint I/O), ``graph`` (inside a compiled TensorFlow function, which may hold the
input pipeline too: stacks cannot tell), ``other``; and ``startup``, every sample of a process
before its first training-phase sample (imports, building the model), which no share counts
(a PyTorch ``data`` sample starts training only while the loader is iterated:
:func:`starts_training`). ``exit`` is a sample inside the process's shutdown (:data:`EXITING`:
a DataLoader joining its workers, ``atexit`` and ``weakref`` finalizers): never ``data``, and
after the last training sample it belongs to the exit, which no share counts either.
A sample inside an ``import``, or joining a process group, is ``setup``: counted as ``other``
once training has started, and never starting it.
"""

from __future__ import annotations

import linecache
import re
from collections.abc import Sequence
from typing import NamedTuple

__all__ = [
    "BUILDING",
    "EXITING",
    "ITERATING",
    "LINE_PATTERNS",
    "LOADING",
    "PHASES",
    "TABLES",
    "TRAINING",
    "Frame",
    "Row",
    "bare",
    "classify",
    "exiting",
    "fold",
    "folded_exiting",
    "framework_of",
    "idle_process",
    "starts_training",
]


class Frame(NamedTuple):
    file: str  #: the code's file name as Python has it (absolute, or py-spy's short form)
    func: str
    line: int


class Row(NamedTuple):
    phase: str
    path: str  #: a path fragment with "/" separators, matched anywhere in the file name
    funcs: frozenset[str] = frozenset()  #: empty: any function of that file


#: every phase a sample can get, in display order
PHASES = ("data", "h2d", "compute", "gpu_wait", "comm", "ckpt", "graph", "other")
#: phases that mean the training loop has started (samples before the first are "startup")
TRAINING = frozenset({"data", "h2d", "compute", "gpu_wait", "comm", "ckpt", "graph"})


def _r(phase: str, path: str, *funcs: str) -> Row:
    return Row(phase, path, frozenset(funcs))


#: per framework, the frames it is known by. Within a sample, the innermost frame that any row
#: matches decides; the tables never overlap on a file.
TABLES: dict[str, tuple[Row, ...]] = {
    "pytorch": (
        # the profiler's record_function wrapper around a loader's __next__ or an op: the
        # frame outside it decides
        _r("skip", "torch/autograd/profiler.py", "__enter__", "__exit__"),
        _r("skip", "torch/_ops.py", "__call__"),
        _r("data", "torch/utils/data/"),  # DataLoader __next__, worker-queue wait, fetch
        _r("data", "torchdata/"),
        # joining the process group is set-up, not a collective of the training
        _r(
            "setup",
            "torch/distributed/distributed_c10d.py",
            "init_process_group",
            "_new_process_group_helper",
            "new_group",
            "_store_based_barrier",
        ),
        _r("setup", "torch/distributed/rendezvous.py"),
        _r("comm", "torch/distributed/distributed_c10d.py"),  # all_reduce, barrier, broadcast
        _r("comm", "torch/distributed/c10d_logger.py"),
        _r("ckpt", "torch/serialization.py"),  # torch.save / torch.load
        _r("ckpt", "torch/distributed/checkpoint/"),
        _r("ckpt", "safetensors/"),
        _r("gpu_wait", "torch/cuda/__init__.py", "synchronize"),
        _r("gpu_wait", "torch/cuda/streams.py", "synchronize", "wait_event", "wait_stream"),
        _r("compute", "torch/nn/"),  # modules, functional, DDP's forward
        _r("compute", "torch/_tensor.py", "backward"),
        _r("compute", "torch/autograd/"),
        _r("compute", "torch/optim/"),
        _r("compute", "torch/amp/"),
        _r("compute", "torch/_dynamo/"),
        _r("compute", "torch/_inductor/"),
    ),
    "hf": (
        _r("data", "accelerate/data_loader.py"),
        _r("data", "transformers/trainer.py", "get_batch_samples"),
        _r(
            "ckpt",
            "transformers/trainer.py",
            "_save_checkpoint",
            "save_model",
            "_save",
            "_load_from_checkpoint",
            "_save_optimizer_and_scheduler",
        ),
        _r("ckpt", "transformers/modeling_utils.py", "save_pretrained"),
        _r("compute", "transformers/trainer.py", "training_step", "compute_loss"),
        _r("compute", "accelerate/accelerator.py", "backward"),
    ),
    "lightning": (
        _r("data", "lightning/pytorch/loops/fetchers.py"),
        _r("data", "pytorch_lightning/loops/fetchers.py"),
        _r("ckpt", "lightning/fabric/plugins/io/"),
        _r("ckpt", "lightning/pytorch/callbacks/model_checkpoint.py"),
        _r("ckpt", "pytorch_lightning/callbacks/model_checkpoint.py"),
        _r("compute", "lightning/pytorch/loops/optimization/"),
        _r("compute", "lightning/pytorch/core/optimizer.py"),
    ),
    "tensorflow": (
        _r("data", "tensorflow/python/data/"),  # iterator __next__ / get_next outside a graph
        _r("data", "keras/src/trainers/epoch_iterator.py"),
        _r("ckpt", "keras/src/saving/"),
        _r("ckpt", "keras/src/callbacks/model_checkpoint.py"),
        _r("ckpt", "tensorflow/python/checkpoint/"),
        # a compiled train function: inside it, the graph runs the step and (in Keras 3) the
        # tf.data get_next too, on threads Python cannot see: neither data nor compute
        # (docs/diagnosis.md)
        _r("graph", "tensorflow/python/eager/"),
        _r("compute", "keras/src/backend/tensorflow/trainer.py", "train_step"),
    ),
}

#: loading that runs on the training thread without a framework's loader (nanoGPT's
#: ``get_batch`` slicing an ``np.memmap``, a loop that decodes or tokenizes inline): libraries
#: that read, decode or tokenize data, and the functions loops name their batch loading. Read
#: only when no framework's table knew any frame of the sample (a DataLoader's stack stays the
#: DataLoader's, whatever decoder runs inside it). docs/diagnosis.md "Sampled stacks".
LOADING: tuple[Row, ...] = (
    _r("data", "numpy/core/memmap.py"),
    _r("data", "numpy/_core/memmap.py"),
    _r("data", "numpy/lib/npyio.py"),
    _r("data", "numpy/lib/_npyio_impl.py"),
    _r("data", "numpy/lib/format.py"),
    _r("data", "numpy/lib/_format_impl.py"),
    _r("data", "PIL/"),
    _r("data", "torchvision/io/"),
    _r("data", "torchvision/datasets/"),
    _r("data", "torchvision/transforms/"),
    _r("data", "torchaudio/"),
    _r("data", "librosa/"),
    _r("data", "soundfile.py"),
    _r("data", "imageio/"),
    _r("data", "h5py/"),
    _r("data", "pandas/io/"),
    _r("data", "pyarrow/"),
    _r("data", "datasets/"),
    _r("data", "webdataset/"),
    _r("data", "tokenizers/"),
    _r("data", "tiktoken/"),
    _r("data", "sentencepiece/"),
    _r("data", "transformers/tokenization_utils"),
    # a loop's own batch loader, by the names such functions are given
    _r(
        "data",
        "",
        "get_batch",
        "get_batches",
        "load_batch",
        "next_batch",
        "fetch_batch",
        "read_batch",
        "sample_batch",
        "get_data_batch",
    ),
)

#: the trainer's own source line, when its frame is the innermost (a C call runs in it)
LINE_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("gpu_wait", re.compile(r"\.(item|cpu|numpy|tolist)\(\s*\)|\bsynchronize\(")),
    ("h2d", re.compile(r"\.(to|cuda)\(|\bnon_blocking\s*=")),
    # ``x, y = next(it)``: the iterator's own frame has returned, and binding the new batch
    # frees the last one (its shared-memory pages): still getting the batch
    ("data", re.compile(r"\bnext\(")),
)

#: frames that mean something is being built (a model, an optimizer) or moved to the device:
#: set-up, wherever they are on the stack (the innermost frame is then often a generic
#: ``__setattr__``): (path fragment, functions; empty: any)
BUILDING: tuple[tuple[str, frozenset[str]], ...] = (
    ("torch/nn/modules/", frozenset({"__init__", "reset_parameters", "_reset_parameters"})),
    ("torch/nn/modules/module.py", frozenset({"to", "_apply", "cuda", "to_empty"})),
    ("torch/nn/parallel/distributed.py", frozenset({"__init__"})),
    ("torch/optim/", frozenset({"__init__"})),
    ("torch/nn/init.py", frozenset()),
    ("accelerate/utils/memory.py", frozenset()),
)

#: frames of processes that are no trainers: torchrun's agent, torch.multiprocessing.spawn's
#: parent, a DataLoader worker (started with spawn or forkserver it runs the start-up too),
#: multiprocessing's helpers. A child that ``mp.spawn`` started to train is not among them:
#: ``multiprocessing/spawn.py`` alone says nothing.
_IDLE: tuple[tuple[str, frozenset[str]], ...] = (
    ("torch/distributed/run.py", frozenset({"main", "run"})),
    ("torch/distributed/elastic/agent/", frozenset({"run", "_invoke_run"})),
    ("torch/distributed/launcher/api.py", frozenset({"launch_agent"})),
    ("torch/multiprocessing/spawn.py", frozenset({"join", "start_processes", "spawn"})),
    ("torch/utils/data/_utils/worker.py", frozenset({"_worker_loop"})),
    ("multiprocessing/resource_tracker.py", frozenset({"main"})),
    ("multiprocessing/forkserver.py", frozenset({"main"})),
)

#: frames of a process shutting down, wherever they are on the stack: a DataLoader joining its
#: workers (with ``pin_memory`` and ``persistent_workers`` PyTorch's exit joins each worker
#: with a 5-s timeout: 30 s for 6 workers, measured on an H200), Python's ``atexit`` and
#: ``weakref`` finalizers, multiprocessing's and threading's exit hooks. Such a sample is
#: ``exit``, never ``data``: (path fragment, functions; empty: any)
EXITING: tuple[tuple[str, frozenset[str]], ...] = (
    (
        "torch/utils/data/dataloader.py",
        frozenset(
            {
                "_shutdown_workers",
                "__del__",
                "_clean_up_worker",
                "_clean_up_persistent_workers_atexit",
            }
        ),
    ),
    ("weakref.py", frozenset({"_exitfunc"})),
    ("multiprocessing/util.py", frozenset({"_exit_function", "_run_finalizers"})),
    ("threading.py", frozenset({"_shutdown"})),
    ("concurrent/futures/thread.py", frozenset({"_python_exit"})),
)

_ROWS = tuple((fw, row) for fw, rows in TABLES.items() for row in rows)
_memo: dict[tuple[str, str], tuple[str, str] | None] = {}


def bare(func: str) -> str:
    """A function's own name: py-spy names methods with their class (``Tensor.backward``,
    ``_BaseDataLoaderIter.__next__``), Python's frames do not; the tables use the bare name."""
    return func.rsplit(".", 1)[-1]


def _norm(path: str) -> str:
    return "/" + path.replace("\\", "/").lstrip("/")


def _match(frame: Frame) -> tuple[str, str] | None:
    """(framework, phase) of the row that knows this frame, or None."""
    key = (frame.file, frame.func)
    if key in _memo:
        return _memo[key]
    path = _norm(frame.file)
    found = None
    for fw, row in _ROWS:
        if "/" + row.path in path and (not row.funcs or bare(frame.func) in row.funcs):
            found = (fw, row.phase)
            break
    if len(_memo) < 100_000:
        _memo[key] = found
    return found


_built: dict[tuple[str, str], bool] = {}


def _building(frame: Frame) -> bool:
    key = (frame.file, frame.func)
    got = _built.get(key)
    if got is None:
        path = _norm(frame.file)
        got = any(
            "/" + frag in path and (not funcs or bare(frame.func) in funcs)
            for frag, funcs in BUILDING
        )
        if len(_built) < 100_000:
            _built[key] = got
    return got


_exits: dict[tuple[str, str], bool] = {}


def _exit_frame(file: str, func: str) -> bool:
    key = (file, func)
    got = _exits.get(key)
    if got is None:
        path = _norm(file)
        name = bare(func)
        got = any("/" + frag in path and (not funcs or name in funcs) for frag, funcs in EXITING)
        if len(_exits) < 100_000:
            _exits[key] = got
    return got


def exiting(frames: Sequence[Frame]) -> bool:
    """The sample is of the process shutting down (:data:`EXITING`)."""
    return any(_exit_frame(f.file, f.func) for f in frames)


_FOLDED_FRAME = re.compile(r"(.*) \(([^()]*)\)$")


def folded_exiting(folded: str) -> bool:
    """The same for a folded stack as :func:`fold` writes it (``func (file);...``): a run
    recorded before the ``exit`` phase existed is read with today's tables."""
    for part in folded.split(";"):
        m = _FOLDED_FRAME.match(part)
        if m is not None and _exit_frame(m.group(2), m.group(1)):
            return True
    return False


def _line_phase(frame: Frame) -> str | None:
    text = linecache.getline(frame.file, frame.line) if frame.line > 0 else ""
    if not text:
        return None
    code = text.split("#", 1)[0]
    for phase, pat in LINE_PATTERNS:
        if pat.search(code):
            return phase
    return None


def _library(path: str) -> bool:
    return "site-packages/" in path or "dist-packages/" in path or path.startswith("<")


def classify(frames: Sequence[Frame]) -> tuple[str, str]:
    """``(phase, framework)`` of one sample (frames innermost first); framework ``""`` when no
    table knew a frame. A module being imported is ``setup`` (``other`` in every share; a
    framework's module-level code runs then, and is not training), and so is building a
    model or an optimizer, moving a model to the device (:data:`BUILDING`) and joining a
    torch.distributed process group. A process shutting down is ``exit`` (:data:`EXITING`).
    Rows of phase ``skip`` (a profiler's wrapper) decide nothing: the frame outside them
    does."""
    if exiting(frames):
        return "exit", ""
    for f in reversed(frames):
        if f.file.startswith("<frozen importlib") or _building(f):
            return "setup", ""
    for i, f in enumerate(frames):
        hit = _match(f)
        if hit is not None and hit[1] != "skip":
            return hit[1], hit[0]
        if i == 0 and not _library(_norm(f.file)):
            phase = _line_phase(f)
            if phase is not None:
                return phase, ""
    for f in frames:  # no framework knew the sample: loading on the training thread?
        if _loading(f):
            return "data", "io"
    return "other", ""


_loads: dict[tuple[str, str], bool] = {}


def _loading(frame: Frame) -> bool:
    """The frame reads, decodes or tokenizes data, or is a loop's batch loader (:data:`LOADING`)."""
    key = (frame.file, frame.func)
    got = _loads.get(key)
    if got is None:
        path = _norm(frame.file)
        name = bare(frame.func)
        got = any(
            "/" + row.path in path and (not row.funcs or name in row.funcs) for row in LOADING
        )
        if len(_loads) < 100_000:
            _loads[key] = got
    return got


#: functions that iterate an input pipeline: a PyTorch ``data`` sample with one of them on its
#: stack is fetching batches; without (a DataLoader or a sampler being built), it is set-up
ITERATING = frozenset({"__iter__", "__next__"})


def starts_training(frames: Sequence[Frame], phase: str, framework: str) -> bool:
    """Whether a sample of ``phase`` (from :func:`classify`) shows the training loop has begun.
    A PyTorch ``data`` sample does only while the pipeline is iterated: one taken while a
    DataLoader or a DistributedSampler is being built, before the loop, does not (then the
    model is built and DDP joins its process group, for seconds on a busy host, which would
    count as training's ``other``: the likely cause of a CI run in which a DDP rank's samples
    were 24% ``other`` and its data share read 0.672 against its own 0.875, 0.885 without
    them)."""
    if phase not in TRAINING:
        return False
    if phase == "data" and framework == "io":
        # a library reading or writing data (PIL writing a dataset out, np.load of a config)
        # runs in set-up as much as in the loop: loading known only by its frames never
        # starts training; the loop's first forward pass does
        return False
    if phase != "data" or framework != "pytorch":
        return True
    return any(bare(f.func) in ITERATING for f in frames)


def framework_of(frames: Sequence[Frame]) -> str:
    """The framework any table knows in these frames, "" for none."""
    for f in frames:
        hit = _match(f)
        if hit is not None:
            return hit[0]
    return ""


def idle_process(frames: Sequence[Frame]) -> bool:
    """The frames are those of a process that is no trainer (:data:`_IDLE`): checked on every
    sample until training starts."""
    if any(f.file.startswith("<frozen importlib") for f in frames):
        return False  # a module being imported (torch imports torch.distributed.elastic...)
    for f in frames:
        path = _norm(f.file)
        if any("/" + frag in path and bare(f.func) in funcs for frag, funcs in _IDLE):
            return True
    return False


def _short(path: str) -> str:
    p = path.replace("\\", "/")
    for marker in ("site-packages/", "dist-packages/"):
        if marker in p:
            return p.split(marker, 1)[1]
    parts = p.rsplit("/", 2)
    return "/".join(parts[-2:]) if len(parts) > 1 else p


def fold(frames: Sequence[Frame], depth: int = 40) -> str:
    """The sample as one folded-stack line, outermost first, ``func (file)`` per frame, at most
    ``depth`` innermost frames (the flame-graph convention, lines left out so a loop's samples
    fold together)."""
    inner = frames[:depth]
    return ";".join(f"{f.func} ({_short(f.file)})" for f in reversed(inner))
