"""A real ``stallscope agent`` whose GPU readings are replayed from a recorded NVML fixture
(no GPU needed), with one knob for tests: while the file HOT exists, the GPU reads 95 °C.

    python tests/replay_agent.py FIXTURE HOT agent --listen 127.0.0.1:PORT ...

Everything else is the agent's own code path: the gpu source runs against the replay exactly as
it runs against pynvml (stallscope/testing/nvml_replay.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from stallscope.cli import main
from stallscope.sources import gpu
from stallscope.testing.nvml_replay import NvmlReplay, ReplayHandle

HOT_C = 95


class HotReplay(NvmlReplay):
    hot: Path

    def _answer(self, name: str, handle: ReplayHandle, args: tuple[Any, ...]) -> Any:
        if name == "nvmlDeviceGetTemperature" and self.hot.exists():
            return HOT_C
        return super()._answer(name, handle, args)


def run(argv: list[str]) -> int:
    fixture, hot, rest = argv[0], Path(argv[1]), argv[2:]
    replay = HotReplay.load(fixture)
    replay.hot = hot
    real_init = gpu.GpuSource.__init__

    def init(self: gpu.GpuSource, backend: Any = None, **kw: Any) -> None:
        real_init(self, backend=replay, **kw)

    gpu.GpuSource.__init__ = init  # type: ignore[method-assign]
    return main(rest)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
