"""The TensorFlow / Keras adapter of the step probe: ``model.fit`` and custom loops over tf.data.

Built on the framework-free core (:class:`~stallscope.probe.recorder.Recorder`,
:mod:`stallscope.probe.watch`) like the PyTorch adapter, and independent of it. TensorFlow is
imported lazily, only by the functions that need it (never by ``import stallscope``); the Keras
callback that uses this module lives in :mod:`stallscope.integrations.keras`. It registers itself
with :func:`~stallscope.probe.watch.watch` as the adapter of ``tf.data.Dataset`` loaders.

**Custom loops** iterate a dataset eagerly, so the input wait is the host time of ``next()``:
``for x, y in stallscope.watch(dataset): train_step(x, y)`` times it exactly as for a
DataLoader, and :func:`dataset_config` records the pipeline's shape.

**model.fit** cannot be timed that way: Keras 3 calls ``iterator.get_next()`` inside its compiled
train function, and with ``steps_per_execution=k`` runs k steps per call, so the framework's batch
hooks only see "input wait + compute" of whole calls. :func:`instrument` replaces
``model.train_function`` by one that runs the same Keras step function (its ``python_function``,
traced again in a ``tf.function`` of ours) over a :class:`_StampedIterator`: a stand-in for the
iterator, used only while tracing, that puts two ``tf.timestamp()`` ops around each ``get_next()`` /
``get_next_as_optional()`` in the graph (the first before the request, the second once the element
is there, by control dependencies) and writes the pair into a ring of a CPU variable. Every
:data:`READ_EVERY_S` seconds of training (at the first call that ends after that; at the latest
every :data:`READ_EVERY` calls, the ring's capacity; and at each epoch's and training's end) the
host reads that variable once and makes one step record per element: ``wait_s`` is the in-graph time
the step waited for its element, ``host_s`` the time from that element to the next request (the last
step of a call: to the call's return). The per-step cost is two timestamp ops and one scatter into a
variable in the graph; on the host, one clock read and a list append per call, and one compiled
gather of the rows written since the last read every half second, and a tuple per step
(docs/probe.md).
"""

from __future__ import annotations

import inspect
import sys
import time
from collections.abc import Iterable
from typing import Any, TypeVar

from stallscope.probe.loaders import loader_config
from stallscope.probe.notices import warn
from stallscope.probe.recorder import Recorder, env_rank, machine_config, obtain, probe_enabled
from stallscope.probe.watch import Adapter, Watched, register_adapter

__all__ = [
    "RING",
    "TFProbe",
    "TimedTrainFunction",
    "dataset_config",
    "get_tf_probe",
    "instrument",
    "is_tf_dataset",
    "watch_dataset",
]

T = TypeVar("T")

#: seconds between two host reads of the ring: a read costs ~0.1-0.5 ms on a busy CPU, so
#: reading after every call would be ~10% of a 1 ms step, and every 16 calls still ~0.5% of a
#: 5 ms one; twice a second it is at most ~0.1% of any step, and the steps reach the run store
#: (the live view, the agent) within ~1.5 s
READ_EVERY_S = 0.5
#: train-function calls between two host reads at most (the ring holds their steps)
READ_EVERY = 256
#: rows of the in-graph ring of timestamps, at least; it is made
#: ``max(RING, steps_per_execution * (READ_EVERY + 2))`` rows long so that the steps of
#: ``READ_EVERY`` calls always fit
RING = 64


def is_tf_dataset(obj: Any) -> bool:
    """True for a ``tf.data.Dataset`` (without importing TensorFlow when the trainer did not)."""
    tf = sys.modules.get("tensorflow")
    if tf is None:
        return False
    data = getattr(tf, "data", None)
    ds_type = getattr(data, "Dataset", None)
    return ds_type is not None and isinstance(obj, ds_type)


# --- the pipeline's shape ------------------------------------------------------------------------
def _scalar(v: Any) -> Any:
    try:
        v = v.numpy() if hasattr(v, "numpy") else v
        if isinstance(v, bytes):
            return v.decode(errors="replace")
        return v.item() if hasattr(v, "item") else v
    except Exception:  # a value only a graph knows: keep its text
        return repr(v)


def _op_types(ds: Any) -> set[str]:
    out: set[str] = set()
    try:
        for fn in ds._functions():
            out.update(op.type for op in fn.function.graph.get_operations())
    except Exception:  # a transformation without inspectable functions
        pass
    return out


_READ_OPS = {
    "ReadFile",
    "TFRecordDatasetV2",
    "TFRecordDataset",
    "TextLineDatasetV2",
    "TextLineDataset",
    "FixedLengthRecordDatasetV2",
    "DecodeImage",
    "DecodeJpeg",
}
_FILE_SOURCES = ("TFRecord", "TextLine", "FixedLengthRecord")


def _stage(ds: Any) -> dict[str, Any]:
    name = type(ds).__name__.lstrip("_")
    st: dict[str, Any] = {"type": name}
    low = name.lower()
    if "prefetch" in low:
        st["op"] = "prefetch"
        st["buffer"] = _scalar(getattr(ds, "_buffer_size", None))
    elif "interleave" in low:
        st["op"] = "interleave"
        st["parallel"] = _scalar(getattr(ds, "_num_parallel_calls", None))
        st["cycle_length"] = _scalar(getattr(ds, "_cycle_length", None))
    elif "map" in low and "flatmap" not in low:
        st["op"] = "map"
        st["parallel"] = (
            _scalar(ds._num_parallel_calls) if hasattr(ds, "_num_parallel_calls") else None
        )
    elif "cache" in low:
        st["op"] = "cache"
        st["file"] = _scalar(getattr(ds, "_filename", ""))
    elif "unbatch" in low:
        st["op"] = "unbatch"
    elif "batch" in low:
        st["op"] = "batch"
        st["size"] = _scalar(getattr(ds, "_batch_size", None))
        if hasattr(ds, "_num_parallel_calls"):
            st["parallel"] = _scalar(ds._num_parallel_calls)
    elif "shuffle" in low:
        st["op"] = "shuffle"
    elif "options" in low:
        st["op"] = "options"
    else:
        st["op"] = "source" if not ds._inputs() else low.replace("dataset", "")
    ops = _op_types(ds)
    if ops & _READ_OPS or any(s in name for s in _FILE_SOURCES):
        st["reads_files"] = True
    return st


def dataset_config(ds: Any) -> dict[str, Any]:
    """The tf.data knobs that decide input throughput, read off the dataset's Python object
    graph (no element is produced): ``pipeline`` (stages from the source to the end, each with
    its parallelism), and the summary the diagnosis reads: ``prefetch``, ``sequential_maps``
    (maps without ``num_parallel_calls``), ``parallel_maps``, ``interleave``, ``cache``,
    ``reads_files``, ``source_len`` (elements of the source, e.g. files listed), ``batch_size``,
    ``len`` (elements of the whole dataset, None when unknown or infinite)."""
    stages: list[dict[str, Any]] = []
    node = ds
    seen = 0
    while node is not None and seen < 200:
        try:
            stages.append(_stage(node))
            inputs = node._inputs()
        except Exception as exc:  # an odd dataset type: say where the walk stopped
            stages.append({"op": "unknown", "type": type(node).__name__, "error": repr(exc)})
            break
        if not inputs:
            try:
                n = int(node.cardinality())
                stages[-1]["len"] = n if n >= 0 else None
            except Exception:
                pass
        node = inputs[0] if inputs else None
        seen += 1
    stages.reverse()  # source first
    # unbatch() puts a map of its own in front of it (normalising the element structure):
    # not a map the user wrote, so not one to parallelise
    for i, st in enumerate(stages):
        if st["op"] != "unbatch":
            continue
        for j in range(max(0, i - 2), i):  # (map, restructured) sit right before it
            if stages[j]["op"] == "map":
                stages[j]["op"] = "map (inside unbatch)"
    ops = [s["op"] for s in stages]
    maps = [s for s in stages if s["op"] == "map"]
    cfg: dict[str, Any] = {
        "loader_type": "tf.data",
        "pipeline": stages,
        "prefetch": "prefetch" in ops,
        "sequential_maps": sum(1 for s in maps if s.get("parallel") is None),
        "parallel_maps": sum(1 for s in maps if s.get("parallel") is not None),
        "interleave": "interleave" in ops,
        "cache": "cache" in ops,
        "reads_files": any(s.get("reads_files") for s in stages),
        "source_len": stages[0].get("len") if stages else None,
    }
    batches = [s for s in stages if s["op"] in ("batch", "unbatch")]
    if batches and batches[-1]["op"] == "batch":  # after an unbatch, elements are samples
        cfg["batch_size"] = batches[-1].get("size")
    try:
        n = int(ds.cardinality())
        cfg["len"] = n if n >= 0 else None
    except Exception:
        cfg["len"] = None
    try:
        inject = ds.options().experimental_optimization.inject_prefetch
        cfg["inject_prefetch"] = inject is not False
    except Exception:
        pass
    return cfg


# --- the recorder --------------------------------------------------------------------------------
class TFProbe(Recorder):
    """The recorder with TensorFlow's view: tf.data pipeline shape, TF and Keras versions."""

    def describe_loader(self, loader: Any) -> dict[str, Any] | None:
        if is_tf_dataset(loader):
            return dataset_config(loader)
        return loader_config(loader)

    def machine_config(self) -> dict[str, Any]:
        cfg = machine_config()
        for mod in ("tensorflow", "keras"):
            m = sys.modules.get(mod)
            if m is not None:
                cfg[mod] = str(getattr(m, "__version__", None))
        cfg["framework"] = "tensorflow"
        return cfg


def get_tf_probe(rank: int | None = None) -> Recorder | None:
    """This process's recorder (a :class:`TFProbe` when the TF adapter makes it first); None
    when turned off (``STALLSCOPE_PROBE=0``) or when it cannot start."""
    if not probe_enabled():
        return None
    return obtain(env_rank() if rank is None else int(rank), lambda r: TFProbe(rank=r))


def watch_dataset(ds: Iterable[T], *, rank: int | None = None) -> Any:
    """``stallscope.watch`` for a tf.data dataset in a custom (eager) loop."""
    return Watched(ds, get_tf_probe(rank))


# --- model.fit: timestamps around get_next() in the graph -----------------------------------------
class _StampedIterator:
    """Stands in for a tf.data iterator while Keras' step function is traced: each
    ``get_next`` / ``get_next_as_optional`` gets a timestamp before the request and one after
    the element, written as a row ``(request, got)`` into ``ring`` (its last row holds the count
    of rows written). Everything else goes to the real iterator."""

    def __init__(self, it: Any, ring: Any, tf: Any) -> None:
        self._it = it
        self._ring = ring
        self._rows = int(ring.shape[0]) - 1
        self._tf = tf

    def _stamp(self, t0: Any, deps: list[Any], has: Any = None) -> None:
        tf = self._tf
        with tf.control_dependencies(deps):
            t1 = tf.timestamp()
        if has is not None:  # the end of the data is no step: its row is marked with -t1
            t1 = tf.where(has, t1, -t1)
        rows = self._rows
        n = self._ring[rows, 0]
        i = tf.cast(n, tf.int32) % rows
        self._ring.scatter_nd_update(
            [[i], [rows]], tf.stack([tf.stack([t0, t1]), tf.stack([n + 1.0, 0.0])])
        )

    def get_next(self) -> Any:
        tf = self._tf
        t0 = tf.timestamp()
        with tf.control_dependencies([t0]):
            d = self._it.get_next()
        self._stamp(t0, tf.nest.flatten(d, expand_composites=True))
        return d

    def get_next_as_optional(self) -> Any:
        tf = self._tf
        t0 = tf.timestamp()
        with tf.control_dependencies([t0]):
            o = self._it.get_next_as_optional()
        has = o.has_value()
        self._stamp(t0, [has, *tf.nest.flatten(o, expand_composites=True)], has)
        return o

    def __getattr__(self, name: str) -> Any:
        return getattr(self._it, name)


class TimedTrainFunction:
    """``model.train_function`` with per-step input wait (see the module docstring)."""

    def __init__(
        self, model: Any, original: Any, step_fn: Any, probe: Recorder, tf: Any, hooks: Any
    ) -> None:
        # step_fn None: an unknown train function, timed as a whole (wait 0, all compute)
        self.original = original
        self.probe = probe
        self.hooks = hooks
        self._tf = tf
        self._iter_types = (tf.data.Iterator, tf.distribute.DistributedIterator)
        spe = int(getattr(model, "steps_per_execution", 1) or 1)
        self.rows = max(RING, spe * (READ_EVERY + 2))
        with tf.device("/CPU:0"):
            self.ring = tf.Variable(
                tf.zeros([self.rows + 1, 2], tf.float64),
                trainable=False,
                name="stallscope_input_stamps",
            )
        py = getattr(step_fn, "python_function", step_fn)
        ring = self.ring
        self._fn: Any = None
        if step_fn is None:
            pass
        elif getattr(model, "run_eagerly", False):
            self._fn = lambda it: py(_StampedIterator(it, ring, tf))
        else:
            self._fn = tf.function(
                lambda it: py(_StampedIterator(it, ring, tf)), reduce_retracing=True
            )
        self._seen = 0  # rows of the ring already recorded
        self._drained_at = time.time()  # when the host last read the ring
        rows = self.rows

        def read_new(seen: Any) -> Any:
            # the rows written since ``seen`` (at most the ring's length: older ones were
            # overwritten), one gather: a read costs the same whatever the ring's length
            n = tf.cast(ring[rows, 0], tf.int64)
            first = tf.maximum(seen, n - rows)
            return n, first, tf.gather(ring, tf.range(first, n) % rows)

        self._read_new = tf.function(read_new, input_signature=[tf.TensorSpec([], tf.int64)])
        self._calls: list[tuple[float, int | None, int]] = []  # (end, samples, epoch) per call
        self._perf_minus_wall = time.perf_counter() - time.time()
        self.broken = False

    def __call__(self, iterator: Any) -> Any:
        if self.broken or not self.probe.active or not isinstance(iterator, self._iter_types):
            return self.original(iterator)
        hooks = self.hooks
        if hooks is not None and hooks.pending_dataset:
            hooks.describe(getattr(iterator, "_dataset", None))
        if self._fn is None:
            return self._whole_call(iterator)
        opt = self._fn(iterator)
        calls = self._calls
        now = time.time()
        calls.append(
            (
                now,
                hooks.samples if hooks is not None else None,
                hooks.epoch if hooks is not None else 0,
            )
        )
        if now - self._drained_at >= READ_EVERY_S or len(calls) >= READ_EVERY:
            self.drain()
        if self.probe.alerts.due:  # alert callbacks (stallscope.on_alert), between two calls
            self.probe.run_due()
        if not opt.has_value():
            raise StopIteration
        return opt.get_value()

    def _whole_call(self, iterator: Any) -> Any:
        hooks = self.hooks
        t0 = time.perf_counter()
        try:
            return self.original(iterator)
        finally:
            t1 = time.perf_counter()
            p = self.probe
            st = p.state
            last = st.last_end if st.last_end is not None else t0
            p.buffer.push(
                (
                    st.step + 1,
                    t0,
                    max(0.0, t0 - last),
                    t1 - t0,
                    hooks.samples if hooks is not None else None,
                    hooks.epoch if hooks is not None else 0,
                    None,
                    None,
                    1,
                )
            )
            st.step += 1
            st.last_end = t1
            if p.alerts.due:
                p.run_due()

    def drain(self) -> None:
        """Read the ring once and record the steps of the calls since the last read (every
        ``READ_EVERY_S`` seconds or ``READ_EVERY`` calls, and at the end of each epoch and of
        training). Never raises: a failure turns the timing off, once, with a message."""
        calls = self._calls
        if not calls or self._fn is None:
            return
        self._calls = []
        self._drained_at = time.time()
        try:
            n, first, got = self._read_new(self._tf.constant(self._seen, self._tf.int64))
            self._record(int(n), int(first), got.numpy().tolist(), calls)
        except Exception as exc:  # the steps ran; only their records are lost
            self.broken = True
            warn(f"Keras step timing off: {exc!r}")

    def _record(
        self, n: int, first: int, got: list[list[float]], calls: list[tuple[float, int | None, int]]
    ) -> None:
        """One record per ring row since the last read (``got``: rows ``first`` to ``n``).
        Rows and calls are both in time order (on the ``time.time`` clock that
        ``tf.timestamp`` reads): a row belongs to the first call that ended after its element
        came; its host time runs to the next row's request in the same call, or to the call's
        end."""
        p = self.probe
        shift = self._perf_minus_wall
        st, buf = p.state, p.buffer
        queue, cap = buf.queue, buf.capacity
        c, last = 0, len(calls) - 1
        for j in range(first, n):
            t0, t1 = got[j - first]
            if t1 < 0:  # get_next_as_optional() found the end of the data: no step
                continue
            while c < last and t1 > calls[c][0]:
                c += 1
            end, samples, epoch = calls[c]
            t_next = got[j + 1 - first][0] if j + 1 < n else end
            if t_next > end:
                t_next = end
            cur = st.step = st.step + 1
            rec = (cur, t1 + shift, t1 - t0, max(0.0, t_next - t1), samples, epoch, None, None, 1)
            if len(queue) < cap:
                queue.append(rec)
            else:
                buf.dropped += 1
        st.last_end = calls[-1][0] + shift
        self._seen = n


def _step_function(train_function: Any) -> Any:
    """Keras 3's compiled ``multi_step_on_iterator`` inside ``model.train_function``."""
    if isinstance(train_function, TimedTrainFunction):
        return None
    try:
        cells = inspect.getclosurevars(train_function).nonlocals
    except TypeError:  # not a plain function: an unknown Keras
        return None
    return cells.get("multi_step_on_iterator")


def instrument(model: Any, probe: Recorder, hooks: Any = None) -> bool:
    """Replace ``model.train_function`` with one that records each step's input wait. False
    when this Keras does not build its train function the way Keras 3 does on the TensorFlow
    backend: each call is then recorded whole (no input wait, all compute)."""
    fn = getattr(model, "train_function", None)
    if isinstance(fn, TimedTrainFunction):  # a second fit(): same function, new callback
        fn.hooks = hooks
        return fn._fn is not None
    if fn is None:
        return False
    step = _step_function(fn)
    import tensorflow as tf

    model.train_function = TimedTrainFunction(model, fn, step, probe, tf, hooks)
    return step is not None


register_adapter(Adapter("tensorflow", is_tf_dataset, get_tf_probe))
