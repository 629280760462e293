"""Runs built by hand for the diagnosis's tests: series on a fixed clock, the probe's steps, the
procs entities a session records. test_diagnose, test_loadermodel (tests/unit), test_comm and
test_compare (tests/integration) build their runs with these."""

from __future__ import annotations

from collections.abc import Sequence

from stallscope.analysis.diagnose import RunData
from stallscope.store import Series, StepRow

T0 = 1_700_000_000.0


def ser(name: str, entity: str, values: Sequence[float], dt: float = 1.0) -> Series:
    return Series(
        name, entity, [T0 + i * dt for i in range(len(values))], [float(v) for v in values]
    )


def run(
    series: list[Series],
    steps: list[StepRow] | None = None,
    config: dict | None = None,
    meta: dict | None = None,
    entities: list[dict] | None = None,
    **extra: object,
) -> RunData:
    n = max((len(s.v) for s in series), default=0)
    series = [*series, ser("collector.cpu_s", "", [0.001] * n)]
    m = {"start": T0, "end": T0 + n, "physical_cores": 8, "data_devices": []}
    m.update(meta or {})
    probes = (
        [{"rank": 0, "pid": 1, "config": config, "steps": 0, "dropped": 0, "updated": T0}]
        if config is not None
        else []
    )
    ents = list(entities or [])
    # recorded facts go where a session records them: disk facts with the disk entities,
    # dataset size and SMART health in meta.json
    device_info: dict = extra.pop("device_info", None) or {}  # type: ignore[assignment]
    ents += [{"source": "disk", "entity": dev, "attrs": info} for dev, info in device_info.items()]
    m.update(extra)
    return RunData(
        meta=m,
        series={(s.name, s.entity): s for s in series},
        steps=steps or [],
        probes=probes,
        entities=ents,
    )


def procs(roles: dict[str, str]) -> list[dict]:
    """Procs entities as the sampler records them: the root is "main"; workers are its
    children (PyTorch names them pt_data_worker)."""
    main = next(pid for pid, r in roles.items() if r == "main")
    return [
        {
            "source": "procs",
            "entity": pid,
            "attrs": {
                "role": r,
                "ppid": 1 if r == "main" else int(main),
                "name": "python" if r == "main" else "pt_data_worker",
            },
            "first_ts": T0,
            "last_ts": T0,
        }
        for pid, r in roles.items()
    ]


def steps(
    n: int,
    wait: float,
    host: float,
    rank: int = 0,
    epochs: int = 1,
    first_wait: float | None = None,
    h2d: float | None = None,
) -> list[StepRow]:
    out = []
    per = n // epochs
    for i in range(n):
        e = i // per
        w = first_wait if (first_wait is not None and i % per == 0 and e > 0) else wait
        out.append(StepRow(rank, i, T0 + i * (wait + host), w, host, h2d, None, None, 32, e))
    return out


N = 30
WORKERS = procs({"100": "main", "101": "worker", "102": "worker"})
