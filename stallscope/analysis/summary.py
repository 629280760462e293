"""Run summary: per resource, median / p95 / max over the run, and the GPU's idle share.

Pure functions over a loaded run (:class:`~stallscope.analysis.rundata.RunData`); the terminal
rendering lives in :func:`render_summary`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from stallscope.metrics import lookup
from stallscope.stats import percentile
from stallscope.store import Series
from stallscope.units import number

if TYPE_CHECKING:
    from stallscope.analysis.rundata import RunData

__all__ = ["Stat", "phases_text", "render_summary", "stat", "summarize"]


@dataclass(frozen=True)
class Stat:
    metric: str
    entity: str
    unit: str
    n: int
    median: float
    p95: float
    max: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "entity": self.entity,
            "unit": self.unit,
            "n": self.n,
            "median": self.median,
            "p95": self.p95,
            "max": self.max,
        }


def stat(s: Series) -> Stat | None:
    if not s.v:
        return None
    m = lookup(s.name)
    return Stat(
        s.name,
        s.entity,
        m.unit if m else "",
        len(s.v),
        percentile(s.v, 50),
        percentile(s.v, 95),
        max(s.v),
    )


#: what the summary shows, in order: (metric, which entities)
_ROWS: tuple[str, ...] = (
    "gpu.util_pct",
    "gpu.sm_active_pct",
    "gpu.mem_used_mib",
    "gpu.power_w",
    "gpu.temp_c",
    "gpu.mem_temp_c",
    "host.cpu_pct",
    "host.cpu_max_core_pct",
    "host.iowait_pct",
    "host.mem_used_mib",
    "host.swap_in_kb_s",
    "host.shm_used_mib",
    "host.psi_io_some_pct",
    "disk.util_pct",
    "disk.r_await_ms",
    "disk.rkb_s",
    "disk.r_s",
)


def summarize(data: RunData) -> dict[str, Any]:
    """Summary of a stored run as a JSON-able dict."""
    rows: list[dict[str, Any]] = []
    all_series = data.series
    data_devices: Sequence[str] = data.meta.get("data_devices") or ()
    for name in _ROWS:
        for (n, ent), s in sorted(all_series.items()):
            if n != name:
                continue
            if n.startswith("disk.") and data_devices and ent not in data_devices:
                continue
            if n.startswith("disk.") and not data_devices and not any(s.v):
                continue  # idle devices only add noise when no dataset device was named
            st = stat(s)
            if st is not None:
                rows.append(st.as_dict())
    # the trainer tree: main vs workers, summed per sample
    roles = data.roles()
    for role in ("main", "worker"):
        per_ts: dict[float, float] = {}
        for (n, ent), s in all_series.items():
            if n == "procs.cpu_pct" and roles.get(ent) == role:
                for t, v in zip(s.ts, s.v):
                    per_ts[t] = per_ts.get(t, 0.0) + v
        if per_ts:
            st = stat(Series(f"procs.cpu_pct[{role}]", "", list(per_ts), list(per_ts.values())))
            if st is not None:
                d = st.as_dict()
                d["unit"] = "%"
                d["processes"] = sum(1 for r in roles.values() if r == role)
                rows.append(d)
    gpu_idle: dict[str, float] = {}
    for (n, ent), s in all_series.items():
        if n == "gpu.util_pct" and s.v:
            gpu_idle[ent] = round(sum(100.0 - v for v in s.v) / len(s.v) / 100.0, 4)
    cost = all_series.get(("collector.cpu_s", ""))
    out: dict[str, Any] = {"rows": rows, "gpu_idle_share": gpu_idle}
    energy = gpu_energy(data)
    if energy:
        out["gpu_energy"] = energy
    health = gpu_health(data)
    if health:
        out["gpu_health"] = health
    if cost is not None and cost.v:
        out["collector_cpu_s_per_sample"] = round(sum(cost.v) / len(cost.v), 6)
        out["samples"] = len(cost.v)
    tr = data.span
    if tr:
        out["duration_s"] = round(tr[1] - tr[0], 1)
    fx = data.facts()  # the figures every surface shows come from the facts, once
    if fx.steps.samples_per_s is not None:
        out["samples_per_s"] = fx.steps.samples_per_s
        out["throughput_source"] = fx.steps.throughput_source
    if fx.run.exit_code is not None:
        out["exit_code"] = fx.run.exit_code
    win = data.window()
    if win.source != "run":  # start-up, training and exit: phases of their own
        out["phases"] = {
            "startup_s": fx.run.startup_s,
            "training_s": fx.run.window_s,
            "exit_s": fx.run.exit_s,
            "window_source": fx.run.window_source,
        }
        idle: dict[str, float] = {}
        for ent in gpu_idle:
            s = all_series[("gpu.util_pct", ent)]
            inside = [v for t, v in zip(s.ts, s.v) if win.start <= t <= win.end + 1.0]
            if inside:
                idle[ent] = round(sum(100.0 - v for v in inside) / len(inside) / 100.0, 4)
        out["gpu_idle_share_training"] = idle
    return out


def gpu_energy(data: RunData) -> dict[str, dict[str, float]]:
    """Per GPU, the energy it used over the run from its energy counter (``gpu.energy_j``,
    read every 10 s): ``{"kwh", "seconds", "mean_w"}``; GPUs without the counter are left out."""
    out: dict[str, dict[str, float]] = {}
    for (n, ent), s in data.series.items():
        if n != "gpu.energy_j" or len(s.v) < 2:
            continue
        joules, secs = s.v[-1] - s.v[0], s.ts[-1] - s.ts[0]
        if joules < 0 or secs <= 0:  # the driver reloaded mid-run: no honest total
            continue
        out[ent] = {
            "kwh": round(joules / 3.6e6, 6),
            "seconds": round(secs, 1),
            "mean_w": round(joules / secs, 1),
        }
    return out


def gpu_health(data: RunData) -> dict[str, dict[str, Any]]:
    """Per GPU that had a health problem during the run: the XIDs, remaps and retirements."""
    from stallscope.sources.gpu import XID_MEANINGS

    out: dict[str, dict[str, Any]] = {}
    for (n, ent), s in data.series.items():
        if n != "gpu.health_problem" or not s.v or max(s.v) < 0.5:
            continue

        def peak(name: str, ent: str = ent) -> int:
            x = data.get(name, ent)
            return int(max(x.v)) if x is not None and x.v else 0

        last = data.get("gpu.xid_last", ent)
        code = next((int(v) for v in reversed(last.v) if v), 0) if last is not None else 0
        out[ent] = {
            "xid_count": peak("gpu.xid_count"),
            "xid_last": code,
            "xid_meaning": XID_MEANINGS.get(code, ("",))[0] if code else "",
            "row_remap_pending": peak("gpu.row_remap_pending"),
            "row_remap_failed": peak("gpu.row_remap_failed"),
            "retired_pages_pending": peak("gpu.retired_pages_pending"),
            "grew": _grew(data, ent),
        }
    return out


def _grew(data: RunData, ent: str) -> list[str]:
    """What grew on a GPU during the run: "2 rows remapped after uncorrectable ECC errors"."""
    from stallscope.sources.gpu.health import GROWING

    out = []
    for key, what in GROWING:
        x = data.get(f"gpu.{key}", ent)
        n = int(max(x.v) - x.v[0]) if x is not None and x.v else 0
        if n > 0:
            out.append(f"{n} {what.format(s='' if n == 1 else 's')} during the run")
    return out


def health_text(ent: str, h: dict[str, Any]) -> str:
    """``gpu0 needs attention: 1 XID (last 79: the GPU has fallen off the bus); ...``."""
    from stallscope.sources.gpu import health_parts

    return f"{ent} needs attention: {'; '.join(health_parts(h)) or 'a health flag'}"


def energy_text(ent: str, e: dict[str, float]) -> str:
    """``gpu0 used 0.0123 kWh over 1,234 s (mean 268 W)``."""
    return f"{ent} used {e['kwh']:.4g} kWh over {e['seconds']:,.0f} s (mean {e['mean_w']:,.0f} W)"


def render_summary(summary: dict[str, Any]) -> Any:
    """A rich Table of the summary."""
    from rich.table import Table

    from stallscope.textsafe import safe

    table = Table(title="Resources over the run", title_justify="left", show_edge=False)
    for col, just in (
        ("metric", "left"),
        ("entity", "left"),
        ("median", "right"),
        ("p95", "right"),
        ("max", "right"),
        ("unit", "left"),
    ):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    for r in summary["rows"]:
        ent = r["entity"]
        if "processes" in r:
            ent = f"{r['processes']} proc"
        table.add_row(
            safe(r["metric"]),
            safe(str(ent)),
            number(r["median"]),
            number(r["p95"]),
            number(r["max"]),
            r["unit"],
        )
    return table


def sampling_text(meta: dict[str, Any]) -> str:
    """How often the run was sampled, in words: ``every 1 s for the first 2 min, then every 5
    s`` (a run's warm-up), or ``every 5 s`` (``show`` and the report say the same)."""
    iv, wi, ws = meta.get("interval_s"), meta.get("warmup_interval_s"), meta.get("warmup_s")
    if (
        isinstance(wi, (int, float))
        and isinstance(ws, (int, float))
        and ws > 0
        and isinstance(iv, (int, float))
    ):
        return f"every {wi:g} s for the first {ws / 60:g} min, then every {iv:g} s"
    return f"every {iv:g} s" if isinstance(iv, (int, float)) else "interval ?"


#: where the training window came from, in words (analysis/window.py)
_WINDOW_FROM = {
    "probe": "the probe's steps",
    "stacks": "the sampled stacks",
    "workers": "while DataLoader workers ran",
    "gpu": "while the GPU worked",
}


def phases_text(phases: dict[str, Any]) -> str:
    """ "phases: start-up 12 s · training 25 s (the probe's steps) · exit 31 s"."""
    parts = []
    if phases.get("startup_s") is not None:
        parts.append(f"start-up {phases['startup_s']:.0f} s")
    parts.append(
        f"training {phases['training_s']:.0f} s "
        f"({_WINDOW_FROM.get(phases.get('window_source') or '', '?')})"
    )
    if phases.get("exit_s") is not None:
        parts.append(f"exit {phases['exit_s']:.0f} s")
    return "phases: " + " · ".join(parts)
