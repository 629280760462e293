"""Side by side with dcgm-exporter: a real Prometheus scrapes a real dcgm-exporter exposition
(tests/fixtures/dcgm-exporter/, lines users published, SOURCE.md) and a stallscope exporter
whose GPU readings are replayed from a real nvidia-smi capture carrying the identity of the
same GPU. PromQL then joins the two on ``UUID`` and the host label, as an operator's dashboard
does: every dcgm-exporter series of that GPU (three MIG instances, two held by pods) finds
stallscope's series, and the pod labels come through."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXTURES, tool_missing
from test_agent import free_port
from test_agent_deploy import start_prometheus, stop_prometheus, wait_for

pytestmark = [pytest.mark.prometheus]

DCGM = FIXTURES / "dcgm-exporter"
H100_MIG = "nvml-replay-h100-mig-load-from-nvidia-smi-590.48.01.json"


class StaticTarget:
    """A scrape target that answers every GET with one exposition, as dcgm-exporter would."""

    def __init__(self, text: str) -> None:
        body = text.encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_a: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class ReplayedGpu:
    """stallscope's exporter over a replayed H100 capture, given the identity (UUID, PCI bus
    id) of the dcgm-exporter capture's GPU and its host name."""

    def __init__(
        self, tmp: Path, index: int, uuid: str, bus_id: str, hostname: str, host_label: str
    ) -> None:
        from prometheus_client import start_http_server

        from stallscope.agent.exporter import PrometheusSink
        from stallscope.collect import Collector
        from stallscope.sources.gpu import GpuSource
        from stallscope.testing.nvml_replay import NvmlReplay

        doc = json.loads((FIXTURES / H100_MIG).read_text())
        # the capture's GPU at its NVML index; the ones before it keep the capture's masks
        doc["devices"] = [json.loads(json.dumps(doc["devices"][0])) for _ in range(index + 1)]
        doc["devices"][index]["nvmlDeviceGetUUID"] = uuid
        doc["devices"][index]["nvmlDeviceGetPciInfo"] = {"busId": bus_id}
        doc["system"]["nvmlDeviceGetCount"] = index + 1
        path = tmp / "replay.json"
        path.write_text(json.dumps(doc))
        gpu = GpuSource(backend=NvmlReplay.load(path))
        gpu.open()
        self.sink = PrometheusSink(["gpu"], hostname=hostname, host_label=host_label)
        self.collector = Collector([gpu], [self.sink], interval=0.5)
        self.collector.start()
        self.port = free_port()
        self.server, _t = start_http_server(
            self.port, addr="127.0.0.1", registry=self.sink.registry
        )

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.collector.stop(final_sample=False)


def _labels(line: str) -> dict[str, str]:
    from prometheus_client.parser import text_string_to_metric_families

    [fam] = list(text_string_to_metric_families(line))
    return dict(fam.samples[0].labels)


@pytest.mark.parametrize(
    ("capture", "dcgm_metric", "host_label"),
    [
        ("h100-mig-hostname-capital.prom", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Hostname"),
        ("rtx2000-hostname-lower.prom", "DCGM_FI_DEV_FB_FREE", "hostname"),
    ],
)
def test_prometheus_joins_dcgm_exporter_and_stallscope(
    tmp_path: Path, capture: str, dcgm_metric: str, host_label: str
) -> None:
    text = (DCGM / capture).read_text()
    lines = [ln for ln in text.splitlines() if ln.startswith(dcgm_metric + "{")]
    ident = _labels_of_line(lines[0])
    assert host_label in ident, ident  # the capture spells the host label this way
    expected_pods = {_labels_of_line(ln).get("pod") for ln in lines} - {None}
    dcgm = StaticTarget(text)
    ours = ReplayedGpu(
        tmp_path,
        int(ident["gpu"]),
        ident["UUID"],
        ident["pci_bus_id"],
        ident[host_label],
        host_label,
    )
    prom = None
    try:
        prom = start_prometheus(
            tmp_path, [f"127.0.0.1:{dcgm.port}", f"127.0.0.1:{ours.port}"], None
        )
        join = (
            f"{dcgm_metric} * on (UUID, {host_label}) group_left stallscope_gpu_temperature_celsius"
        )
        wait_for(
            prom,
            {
                "dcgm": dcgm_metric,
                "ours": "stallscope_gpu_temperature_celsius",
                "mig": "stallscope_gpu_mig_memory_total_bytes",
                "join": join,
            },
            60,
            [],
        )
        ours_labels = prom.query(f'stallscope_gpu_temperature_celsius{{gpu="{ident["gpu"]}"}}')[0][
            "metric"
        ]
        # every identity label dcgm-exporter gives the GPU, spelled and valued alike
        for k in ("gpu", "UUID", "pci_bus_id", "device", host_label):
            assert ours_labels.get(k) == ident[k], (k, ours_labels, ident)
        # the same join on a GPU's identity alone, written the way dashboards do
        joined = prom.query(join)
        assert len(joined) == len(lines), joined
        assert {r["metric"]["pod"] for r in joined if r["metric"].get("pod")} == expected_pods
        # and the other way: stallscope's reading with the pods that hold the GPU's instances
        back = prom.query(
            f"stallscope_gpu_power_watts * on (UUID, {host_label}) "
            f"group_right count by (UUID, {host_label}, pod) ({dcgm_metric})"
        )
        assert {r["metric"].get("pod") for r in back} >= expected_pods
        if "GPU_I_ID" in ident:
            # MIG: the replayed H100 has GPU instances 2, 3, 9, 10; the published one 7, 8, 9:
            # the instance both have (9, a 1g.10gb in both) joins on GPU_I_ID, its pod along
            mig = prom.query(
                f"{dcgm_metric} * on (UUID, GPU_I_ID, {host_label}) group_left "
                "(GPU_I_PROFILE) stallscope_gpu_mig_memory_total_bytes"
            )
            assert [(r["metric"]["GPU_I_ID"], r["metric"]["GPU_I_PROFILE"]) for r in mig] == [
                ("9", "1g.10gb")
            ], mig
            assert mig[0]["metric"]["pod"].startswith("tts-predictor")
        # spelled the other way (copied to it, then this spelling blanked), the same
        # series join nothing: why host_label must follow the fleet's dcgm-exporter
        other = "hostname" if host_label == "Hostname" else "Hostname"
        respelled = (
            f"label_replace(label_replace(stallscope_gpu_temperature_celsius, "
            f'"{other}", "$1", "{host_label}", "(.*)"), "{host_label}", "", '
            f'"{host_label}", ".*")'
        )
        assert prom.query(respelled), respelled
        assert prom.query(f"{dcgm_metric} * on (UUID, {host_label}) group_left {respelled}") == []
    finally:
        if prom is not None:
            stop_prometheus(prom)
        ours.stop()
        dcgm.stop()


def _labels_of_line(line: str) -> dict[str, str]:
    name = line.split("{", 1)[0]
    return _labels(f"# TYPE {name} gauge\n{line}\n")


def test_the_fixtures_are_dcgm_exporters_shape() -> None:
    """Both captures parse as Prometheus text and carry dcgm-exporter's GPU identity labels."""
    if not DCGM.is_dir():
        tool_missing("tests/fixtures/dcgm-exporter")
    for f in sorted(DCGM.glob("*.prom")):
        for ln in f.read_text().splitlines():
            if ln and not ln.startswith("#"):
                labels = _labels_of_line(ln)
                assert {"gpu", "UUID", "pci_bus_id", "device", "modelName"} <= set(labels), f
                assert ("Hostname" in labels) != ("hostname" in labels), f
