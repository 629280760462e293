"""stallscope.labels: the one label map, out (the agent's /metrics) and back (diagnose
--prometheus), over every exported metric of the vocabulary."""

from __future__ import annotations

from typing import Any

import pytest

from stallscope.labels import ENTITY_LABELS, attrs_of, entity_of, host_of, labels_for
from stallscope.metrics import METRICS, SOURCE_LABEL

#: one entity of each label kind, and the attributes its source gives
SAMPLES: dict[str, tuple[str, dict[str, Any]]] = {
    "gpu": ("gpu1", {"uuid": "GPU-5f3e", "pci_bus_id": "00000000:1B:00.0", "name": "NVIDIA H100"}),
    "pid": (
        "4242",
        {
            "role": "worker",
            "name": "pt_data_worker",
            "run": "20261125-x",
            "rank": "1",
            "ppid": "4200",
        },
    ),
    "gpu_pid": (
        "gpu1:4242",
        {
            "uuid": "GPU-5f3e",
            "name": "NVIDIA H100",
            "namespace": "team-a",
            "pod": "trainer-0",
            "container": "pytorch",
        },
    ),
    "gpu_mig": ("gpu0/gi9", {"uuid": "GPU-5f3e", "name": "NVIDIA H100", "mig_profile": "1g.10gb"}),
    "gpu_xid": ("gpu0/xid79", {"uuid": "GPU-5f3e", "name": "NVIDIA H200"}),
    "device": ("nvme0n1", {}),
    "cpu": ("cpu3", {}),
    "mode": ("iowait", {}),
    "rank": ("rank2", {}),
}


def test_every_metric_names_its_entity_label() -> None:
    for m in METRICS:
        assert m.label == "" or m.label in ENTITY_LABELS, m.name
        assert m.source in SOURCE_LABEL, m.name


@pytest.mark.parametrize("m", [m for m in METRICS if m.prom], ids=lambda m: m.name)
def test_round_trip(m: Any) -> None:
    entity, attrs = SAMPLES[m.label] if m.label else ("", {})
    labels = labels_for(m, entity, attrs, "node-a")
    assert entity_of(m, labels) == entity
    assert attrs_of(m, labels) == {k: str(v) for k, v in attrs.items()}
    # the attributes are optional: without them the entity still comes back
    assert entity_of(m, labels_for(m, entity, {}, "node-a")) == entity


def test_gpu_labels_are_dcgm_exporters() -> None:
    m = next(m for m in METRICS if m.name == "gpu.util_pct")
    entity, attrs = SAMPLES["gpu"]
    assert labels_for(m, entity, attrs, "node-a") == {
        "gpu": "1",
        "UUID": "GPU-5f3e",
        "pci_bus_id": "00000000:1B:00.0",
        "device": "nvidia1",
        "modelName": "NVIDIA H100",
        "Hostname": "node-a",
    }
    # attributes NVML did not give are left out, never empty
    assert labels_for(m, "gpu0", {"uuid": "", "name": None}, "n") == {
        "gpu": "0",
        "device": "nvidia0",
        "Hostname": "n",
    }
    # a fleet whose dcgm-exporter spells it "hostname" (its builds after May 2026)
    assert labels_for(m, "gpu0", {}, "n", "hostname") == {
        "gpu": "0",
        "device": "nvidia0",
        "hostname": "n",
    }
    # read back in either spelling
    assert host_of({"Hostname": "a"}) == host_of({"hostname": "a"}) == "a"
    assert host_of({"instance": "x:1"}) == ""


def test_process_and_host_labels() -> None:
    proc = next(m for m in METRICS if m.name == "procs.cpu_pct")
    entity, attrs = SAMPLES["pid"]
    assert labels_for(proc, entity, attrs, "node-a") == {
        "pid": "4242",
        "role": "worker",
        "name": "pt_data_worker",
        "run": "20261125-x",
        "rank": "1",
        "ppid": "4200",
        "Hostname": "node-a",
    }
    core = next(m for m in METRICS if m.name == "host.cpu_core_pct")
    assert labels_for(core, "cpu3", {}, "node-a") == {"cpu": "3"}
    host = next(m for m in METRICS if m.name == "host.mem_used_mib")
    assert labels_for(host, "", {}, "node-a") == {}
    assert entity_of(host, {"instance": "x:9"}) == ""


def test_a_process_on_a_gpu_has_the_gpus_labels_its_pid_and_its_owner() -> None:
    m = next(m for m in METRICS if m.name == "gpu.proc_sm_pct")
    entity, attrs = SAMPLES["gpu_pid"]
    assert labels_for(m, entity, attrs, "node-a") == {
        "gpu": "1",
        "pid": "4242",
        "device": "nvidia1",
        "UUID": "GPU-5f3e",
        "modelName": "NVIDIA H100",
        "namespace": "team-a",
        "pod": "trainer-0",
        "container": "pytorch",
        "Hostname": "node-a",
    }
    assert entity_of(m, {"gpu": "1", "pid": "4242"}) == "gpu1:4242"


def test_a_mig_instance_is_labelled_as_dcgm_exporter_labels_it() -> None:
    m = next(m for m in METRICS if m.name == "gpu.mig_mem_used_mib")
    entity, attrs = SAMPLES["gpu_mig"]
    assert labels_for(m, entity, attrs, "node-a") == {
        "gpu": "0",
        "GPU_I_ID": "9",
        "device": "nvidia0",
        "UUID": "GPU-5f3e",
        "modelName": "NVIDIA H100",
        "GPU_I_PROFILE": "1g.10gb",
        "Hostname": "node-a",
    }
    assert entity_of(m, {"gpu": "0", "GPU_I_ID": "9"}) == "gpu0/gi9"
