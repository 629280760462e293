"""Writes deploy/grafana/stallscope.json, the Grafana dashboard for stallscope agents.

    python scripts/make_grafana_dashboard.py            # rewrite the file
    python scripts/make_grafana_dashboard.py --check    # exit 1 if the file differs

Panels read the agents' series and the recording rules of
deploy/prometheus/stallscope-recording.yml (load both). tests/integration/test_agent_deploy.py
runs every panel's PromQL against a real Prometheus scraping real agents.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "stallscope.json"
DS = {"type": "prometheus", "uid": "${datasource}"}
INST = 'instance=~"$instance"'
RUN = 'run=~"$run"'

#: (row title, [(panel title, unit, [(expr, legend)], description)])
ROWS: list[tuple[str, list[tuple[str, str, list[tuple[str, str]], str]]]] = [
    (
        "Training (stallscope.watch probes)",
        [
            (
                "Data-wait share per rank",
                "percentunit",
                [
                    (
                        f"rank:stallscope_train_data_wait:ratio_rate1m{{{INST},{RUN}}}",
                        "{{run}} rank {{rank}} ({{instance}})",
                    )
                ],
                "Share of each rank's step time spent waiting for its next batch; from 0.15 on "
                "stallscope calls the rank input-bound.",
            ),
            (
                "Step time per rank",
                "s",
                [
                    (
                        f"rank:stallscope_train_step_seconds:mean_rate1m{{{INST},{RUN}}}",
                        "{{run}} rank {{rank}}",
                    )
                ],
                "Mean step wall time (data wait + compute).",
            ),
            (
                "Samples per second per run",
                "none",
                [(f"run:stallscope_train_samples:rate1m{{{RUN}}}", "{{run}}")],
                "Training throughput, from the probes that know the batch size.",
            ),
            (
                "Input-bound share of ranks",
                "percentunit",
                [
                    (f"run:stallscope_train_input_bound_ranks:ratio{{{RUN}}}", "{{run}}"),
                    ("cluster:stallscope_train_input_bound_ranks:ratio", "all runs"),
                ],
                "Share of training ranks (GPUs) whose data wait is at least 15% of step time.",
            ),
            (
                "Trainer and DataLoader-worker CPU per rank",
                "none",
                [
                    (
                        "sum by (run, rank, role) (rate(stallscope_proc_cpu_seconds_total"
                        f"{{{INST},{RUN}}}[1m]))",
                        "{{run}} rank {{rank}} {{role}}",
                    )
                ],
                "Cores used by each rank's trainer process (main) and by its DataLoader workers "
                "together (worker): workers near their count in cores are CPU-bound in the "
                "transform.",
            ),
            (
                "Trainer and DataLoader-worker memory per rank",
                "bytes",
                [
                    (
                        "sum by (run, rank, role) (stallscope_proc_resident_memory_bytes"
                        f"{{{INST},{RUN}}})",
                        "{{run}} rank {{rank}} {{role}}",
                    )
                ],
                "Resident memory of each rank's trainer and of its workers together: workers that "
                "grow each epoch copy the dataset (copy-on-access of Python objects).",
            ),
        ],
    ),
    (
        "GPU",
        [
            (
                "GPU utilisation",
                "percentunit",
                [(f"stallscope_gpu_utilization_ratio{{{INST}}}", "{{instance}} GPU {{gpu}}")],
                "Time a kernel ran (nvidia-smi utilization.gpu).",
            ),
            (
                "GPUs under 50% per node",
                "percentunit",
                [(f"instance:stallscope_gpu_underused:ratio{{{INST}}}", "{{instance}}")],
                "Share of a node's GPUs below 50% utilisation: idle GPUs are where an input-bound "
                "training shows without a probe.",
            ),
            (
                "GPU memory used",
                "bytes",
                [(f"stallscope_gpu_memory_used_bytes{{{INST}}}", "{{instance}} GPU {{gpu}}")],
                "",
            ),
            (
                "GPU power and limit",
                "watt",
                [
                    (f"stallscope_gpu_power_watts{{{INST}}}", "{{instance}} GPU {{gpu}}"),
                    (
                        f"stallscope_gpu_power_limit_watts{{{INST}}}",
                        "{{instance}} GPU {{gpu}} limit",
                    ),
                ],
                "",
            ),
            (
                "GPU temperature",
                "celsius",
                [(f"stallscope_gpu_temperature_celsius{{{INST}}}", "{{instance}} GPU {{gpu}}")],
                "",
            ),
            (
                "Clock event reasons active",
                "none",
                [
                    (
                        f"stallscope_gpu_throttle_active{{{INST}}} == 1",
                        "{{instance}} GPU {{gpu}} {{reason}}",
                    )
                ],
                "NVML clock event (throttle) reasons active now, by NVML's name.",
            ),
            (
                "PCIe throughput",
                "Bps",
                [
                    (
                        f"stallscope_gpu_pcie_rx_bytes_per_second{{{INST}}}",
                        "{{instance}} GPU {{gpu}} rx",
                    ),
                    (
                        f"stallscope_gpu_pcie_tx_bytes_per_second{{{INST}}}",
                        "{{instance}} GPU {{gpu}} tx",
                    ),
                ],
                "",
            ),
        ],
    ),
    (
        "Disk (iostat -x)",
        [
            (
                "Disk utilisation (%util)",
                "percentunit",
                [
                    (
                        f"instance_device:stallscope_disk_io_time:ratio_rate1m{{{INST}}}",
                        "{{instance}} {{device}}",
                    )
                ],
                "Share of time the device had I/O in flight.",
            ),
            (
                "Read throughput",
                "Bps",
                [
                    (
                        f"instance_device:stallscope_disk_read_bytes:rate1m{{{INST}}}",
                        "{{instance}} {{device}}",
                    )
                ],
                "",
            ),
            (
                "Read latency (r_await)",
                "s",
                [
                    (
                        f"instance_device:stallscope_disk_read_await:seconds_rate1m{{{INST}}}",
                        "{{instance}} {{device}}",
                    )
                ],
                "Mean read latency including queueing.",
            ),
            (
                "Queue length (aqu-sz)",
                "none",
                [
                    (
                        f"instance_device:stallscope_disk_queue_length:rate1m{{{INST}}}",
                        "{{instance}} {{device}}",
                    )
                ],
                "",
            ),
        ],
    ),
    (
        "Host",
        [
            (
                "CPU busy and iowait",
                "percentunit",
                [
                    (
                        f"instance:stallscope_host_cpu_busy:ratio_rate1m{{{INST}}}",
                        "{{instance}} busy",
                    ),
                    (
                        f"instance:stallscope_host_cpu_iowait:ratio_rate1m{{{INST}}}",
                        "{{instance}} iowait",
                    ),
                ],
                "",
            ),
            (
                "Busiest core",
                "percentunit",
                [(f"stallscope_host_cpu_max_core_busy_ratio{{{INST}}}", "{{instance}}")],
                "A single saturated core (the trainer's main thread) hides in the average.",
            ),
            (
                "I/O pressure (PSI some)",
                "percentunit",
                [(f"instance:stallscope_host_psi_io_some:ratio_rate1m{{{INST}}}", "{{instance}}")],
                "Share of time some task stalled on I/O.",
            ),
            (
                "Memory and /dev/shm used",
                "percentunit",
                [
                    (
                        f"instance:stallscope_host_memory_used:ratio{{{INST}}}",
                        "{{instance}} memory",
                    ),
                    (f"stallscope_host_shm_used_ratio{{{INST}}}", "{{instance}} /dev/shm"),
                ],
                "DataLoader workers hand batches over through /dev/shm.",
            ),
        ],
    ),
    (
        "SMART (drives the agent's config lists: smart = [...])",
        [
            (
                "SMART verdict failing",
                "none",
                [(f"stallscope_smart_failing{{{INST}}}", "{{instance}} {{device}}")],
                "1 while the drive's SMART verdict is failing (the same judgement as `stallscope "
                "disk`), checked every 10 minutes; 0 otherwise.",
            ),
            (
                "Medium-defect growth since the baseline check",
                "none",
                [(f"stallscope_smart_medium_growth{{{INST}}}", "{{instance}} {{device}}")],
                "Growth of reallocated, pending, offline-uncorrectable and reported-uncorrect "
                "sectors, NVMe media errors and SAS grown defects: growth, not the count, is what "
                "precedes failure.",
            ),
            (
                "Reallocated and pending sectors",
                "none",
                [
                    (
                        f"stallscope_smart_reallocated_sectors{{{INST}}}",
                        "{{instance}} {{device}} reallocated",
                    ),
                    (
                        f"stallscope_smart_pending_sectors{{{INST}}}",
                        "{{instance}} {{device}} pending",
                    ),
                ],
                "SMART 5 and 197 raw values (ATA drives).",
            ),
            (
                "NVMe endurance used and spare left",
                "percentunit",
                [
                    (
                        f"stallscope_smart_nvme_percentage_used_ratio{{{INST}}}",
                        "{{instance}} {{device}} used",
                    ),
                    (
                        f"stallscope_smart_nvme_available_spare_ratio{{{INST}}}",
                        "{{instance}} {{device}} spare",
                    ),
                ],
                "NVMe percentage_used (can pass 100%) and available_spare.",
            ),
        ],
    ),
    (
        "Agent",
        [
            (
                "Sources up",
                "none",
                [(f"stallscope_source_up{{{INST}}}", "{{instance}} {{source}}")],
                "1 when the source gave a reading in the latest sample (why not: /api/v1/health).",
            ),
            (
                "Agent CPU (share of one core)",
                "percentunit",
                [(f"instance:stallscope_agent_cpu:ratio_rate1m{{{INST}}}", "{{instance}}")],
                "",
            ),
            (
                "Seconds since the last sample",
                "s",
                [
                    (
                        f"time() - stallscope_collector_last_sample_timestamp_seconds{{{INST}}}",
                        "{{instance}}",
                    )
                ],
                "Grows when sampling is stuck.",
            ),
        ],
    ),
]


def panel(
    pid: int, title: str, unit: str, targets: list[tuple[str, str]], desc: str, x: int, y: int
) -> dict[str, Any]:
    return {
        "id": pid,
        "type": "timeseries",
        "title": title,
        "description": desc,
        "datasource": DS,
        "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": unit, "min": 0}, "overrides": []},
        "options": {
            "legend": {"displayMode": "list", "placement": "bottom"},
            "tooltip": {"mode": "multi"},
        },
        "targets": [
            {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": chr(ord("A") + i)}
            for i, (expr, legend) in enumerate(targets)
        ],
    }


def dashboard() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    pid, y = 1, 0
    for title, row in ROWS:
        panels.append(
            {
                "id": pid,
                "type": "row",
                "title": title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        pid, y = pid + 1, y + 1
        for i, (ptitle, unit, targets, desc) in enumerate(row):
            panels.append(panel(pid, ptitle, unit, targets, desc, 12 * (i % 2), y + 8 * (i // 2)))
            pid += 1
        y += 8 * ((len(row) + 1) // 2)

    def var(name: str, label: str, metric: str) -> dict[str, Any]:
        q = f"label_values({metric}, {name})"
        return {
            "name": name,
            "label": label,
            "type": "query",
            "datasource": DS,
            "query": {"query": q, "refId": f"{name}-values"},
            "definition": q,
            "includeAll": True,
            "multi": True,
            "allValue": ".*",
            "refresh": 2,
            "current": {"text": "All", "value": "$__all"},
            "sort": 1,
        }

    return {
        "title": "stallscope: why is the GPU waiting",
        "uid": "stallscope-agent",
        "description": "stallscope agents (stallscope agent): training data wait per rank, GPU, "
        "disk, host. Needs deploy/prometheus/stallscope-recording.yml loaded.",
        "tags": ["stallscope", "gpu", "training"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "",
        "links": [],
        "annotations": {"list": []},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                },
                var("instance", "Node", "stallscope_source_up"),
                # every run the agents follow has processes; only runs with a probe have steps
                var("run", "Run", "stallscope_proc_cpu_seconds_total"),
            ]
        },
        "panels": panels,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2, ensure_ascii=False) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the file is out of date")
    args = ap.parse_args()
    text = render()
    if args.check:
        ok = OUT.is_file() and OUT.read_text(encoding="utf-8") == text
        if not ok:
            print(f"{OUT} is out of date: run python scripts/make_grafana_dashboard.py")
        return 0 if ok else 1
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
