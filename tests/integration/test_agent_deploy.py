"""What ships for the agent, checked with the real tools: the recording rules (promtool, and a
real Prometheus evaluating them over real agents), the Grafana dashboard (every panel's PromQL
against that Prometheus), the training steps that probes report through the agent, and
``diagnose --prometheus`` giving the local verdict from cluster data."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import FIXTURES, ROOT, stallscope_argv, terminate, tool_missing, training_finding
from test_agent import (
    H100_LOAD,
    RTX_IDLE_POWER_CAP,
    RunningAgent,
    first_metrics,
    free_port,
    get,
    start_agent,
    stop_agent,
)

RECORDING = ROOT / "deploy" / "prometheus" / "stallscope-recording.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "stallscope.json"
TRAIN = str(ROOT / "examples" / "train_cpu.py")
#: a recorded series or a metric name in an expression
_NAME = re.compile(r"\b([a-z_]+:[a-z0-9_:]+|stallscope_[a-z0-9_]+)\b")


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        tool_missing("promtool (Debian package prometheus)")
        raise AssertionError  # unreachable: tool_missing fails or skips
    return path


def exported_names() -> set[str]:
    from stallscope.agent.exporter import AGENT_METRICS, exported_metrics
    from stallscope.agent.steps import STEP_METRICS

    names = {m.prom for m in exported_metrics()}
    names |= {n for n, _k, _h in (*AGENT_METRICS, *STEP_METRICS)}
    return names


def recorded_names() -> set[str]:
    return set(re.findall(r"^\s*- record: (\S+)", RECORDING.read_text(), re.M))


def dashboard_targets() -> list[tuple[str, str]]:
    doc = json.loads(DASHBOARD.read_text())
    return [
        (p["title"], t["expr"]) for p in doc["panels"] if p["type"] != "row" for t in p["targets"]
    ]


def concrete(expr: str) -> str:
    """A panel's expression as Grafana sends it with every variable at "All"."""
    return expr.replace("$instance", ".*").replace("$run", ".*")


# --- the files, statically ------------------------------------------------------------------------


@pytest.mark.prometheus
def test_recording_rules_pass_promtool() -> None:
    r = subprocess.run(
        [promtool(), "check", "rules", str(RECORDING)], capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(recorded_names())} rules found" in r.stdout


def recording_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RECORDING.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_recording_rules_read_only_exported_series() -> None:
    rules = recording_rules()
    assert {r["record"] for r in rules} == recorded_names()
    used = {n for r in rules for n in _NAME.findall(r["expr"])}
    assert used, "no expression found in the rules file"
    unknown = used - exported_names() - recorded_names()
    assert not unknown, f"rules read series the agent does not export: {unknown}"


def test_dashboard_structure() -> None:
    doc = json.loads(DASHBOARD.read_text())
    assert doc["uid"] and doc["title"] and isinstance(doc["schemaVersion"], int)
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    variables = {v["name"] for v in doc["templating"]["list"]}
    assert variables == {"datasource", "instance", "run"}
    panels = [p for p in doc["panels"] if p["type"] != "row"]
    assert len(panels) >= 15
    for p in panels:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        assert p["targets"] and all(t["expr"] and t["refId"] for t in p["targets"]), p["title"]
        for t in p["targets"]:
            left = set(re.findall(r"\$\{?(\w+)", t["expr"])) - variables
            assert not left, f"{p['title']}: unknown variables {left}"
    used = {n for _title, e in dashboard_targets() for n in _NAME.findall(e)}
    unknown = used - exported_names() - recorded_names()
    assert not unknown, f"the dashboard reads series nobody produces: {unknown}"
    # GPU, disk, host and the training's data wait per rank are all there
    text = json.dumps(doc)
    for needed in ("stallscope_gpu_", "disk_io_time", "host_cpu", "train_data_wait"):
        assert needed in text, needed


def test_dashboard_is_what_the_script_writes() -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "make_grafana_dashboard.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_docs_list_the_step_metrics() -> None:
    from stallscope.agent.steps import STEP_METRICS

    doc = (ROOT / "docs" / "agent.md").read_text()
    missing = [n for n, _k, _h in STEP_METRICS if f"`{n}`" not in doc]
    assert not missing, f"docs/agent.md does not list {missing}"


# --- a real Prometheus over real agents, one node training ----------------------------------------


class Prometheus:
    def __init__(self, proc: subprocess.Popen[bytes], base: str) -> None:
        self.proc, self.base = proc, base

    def query(self, promql: str) -> list[dict[str, Any]]:
        url = f"{self.base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                doc = json.loads(r.read())
        except urllib.error.HTTPError as exc:
            doc = json.loads(exc.read())
        assert doc["status"] == "success", (promql, doc)
        result: list[dict[str, Any]] = doc["data"]["result"]
        return result


def start_prometheus(tmp: Path, targets: list[str], rules: Path | None) -> Prometheus:
    exe = shutil.which("prometheus")
    if exe is None:
        tool_missing("prometheus (Debian package prometheus)")
    port = free_port()
    config = tmp / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        + (f"rule_files: [{json.dumps(str(rules))}]\n" if rules else "")
        + "scrape_configs:\n  - job_name: stallscope\n    scrape_interval: 1s\n"
        "    scrape_timeout: 1s\n    static_configs:\n"
        f"      - targets: {json.dumps(targets)}\n"
    )
    proc = subprocess.Popen(
        [
            str(exe),
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=tmp,
        env=dict(os.environ, HOME=str(tmp)),
    )
    return Prometheus(proc, f"http://127.0.0.1:{port}")


def stop_prometheus(p: Prometheus) -> None:
    terminate(p.proc, 15)


#: real smartctl --json outputs replayed as the third node's drives (README-smartctl.md): an
#: ATA disk with 304 reallocated sectors (failing), a failing NVMe, an ageing SATA SSD
SMART_REPLAY = (
    "smartctl-ST3500418AS_12.json",
    "smartctl-nvme-null-SAMSUNG_MZWLL3T2HAJQ-00005-nvme0.json",
    "smartctl-sat-Intel_730_and_DC_S35x0_3610_3700_Series_SSDs-INTEL_SSDSC2BB016T4-sdf.json",
)


class ReplayGpuNode:
    """A third node with two GPUs and three drives: the real exporter over replayed NVML
    readings (real nvidia-smi captures, tests/fixtures/README-nvml.md) and replayed SMART checks
    (real smartctl --json outputs, judged by the same code as `stallscope disk`), served over
    real HTTP on loopback. No drive here lets smartctl read SMART (a virtio disk)."""

    def __init__(self) -> None:
        from prometheus_client import start_http_server

        from stallscope.agent.exporter import PrometheusSink
        from stallscope.collect import Collector
        from stallscope.sources.gpu import GpuSource
        from stallscope.sources.smart import SmartSource, parse_smartctl
        from stallscope.testing.nvml_replay import NvmlReplay

        replay = NvmlReplay.load(FIXTURES / RTX_IDLE_POWER_CAP, FIXTURES / H100_LOAD)
        gpu = GpuSource(backend=replay)
        gpu.open()
        drives = [
            parse_smartctl(json.loads((FIXTURES / f).read_text()), source=f) for f in SMART_REPLAY
        ]
        smart = SmartSource(
            ["/dev/sda", "/dev/nvme0", "/dev/sdf"], check=lambda _devices: (drives, [])
        )
        smart.open()
        self.sink = PrometheusSink(["gpu", "smart"], hostname="gpu-node")
        self.collector = Collector([gpu, smart], [self.sink], interval=0.5)
        self.collector.start()
        self.port = free_port()
        self.server, _thread = start_http_server(
            self.port, addr="127.0.0.1", registry=self.sink.registry
        )

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.collector.stop(final_sample=False)


def wait_for(prom: Prometheus, what: dict[str, str], timeout: float, alive: list[Any]) -> None:
    """Poll until every query returns data; fail naming what never came."""
    deadline = time.monotonic() + timeout
    missing = dict(what)
    while missing and time.monotonic() < deadline:
        for proc in alive:
            if proc.poll() is not None and proc.returncode not in (0, None):
                err = proc.stderr.read() if proc.stderr else ""
                pytest.fail(f"{proc.args[:4]} exited {proc.returncode}: {err!s:.2000}")
        if prom.proc.poll() is not None:
            pytest.fail(
                "prometheus exited: "
                + (prom.proc.stderr.read().decode() if prom.proc.stderr else "")
            )
        for key, q in list(missing.items()):
            try:
                if prom.query(q):
                    del missing[key]
            except OSError:
                pass
        time.sleep(0.5)
    assert not missing, f"never arrived in Prometheus: {missing}"


def both_diagnoses(
    trainer: subprocess.Popen[str], out: Path, prom: Prometheus, port: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Let the training end, then diagnose it from its run directory and from Prometheus (the
    agent on ``port``): the two `diagnose --json` documents."""
    trainer.communicate(timeout=120)
    assert trainer.returncode == 0
    local = subprocess.run(
        stallscope_argv("diagnose", "latest", "--out", str(out), "--json"),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert local.returncode == 0, local.stderr
    time.sleep(2)  # the agents' last scrape of the finished run
    return json.loads(local.stdout), diagnose_over_prometheus(prom, port)


def diagnose_over_prometheus(prom: Prometheus, port: int) -> dict[str, Any]:
    """`stallscope diagnose --prometheus` of the agent on ``port`` over the last 2 minutes at
    1-s steps, as a child process: its JSON."""
    r = subprocess.run(
        stallscope_argv(
            "diagnose",
            "--prometheus",
            prom.base,
            "--instance",
            f"127.0.0.1:{port}",
            "--since",
            "2m",
            "--step",
            "1s",
            "--json",
        ),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    out: dict[str, Any] = json.loads(r.stdout)
    return out


def stop_all(
    trainer: subprocess.Popen[str] | None, prom: Prometheus | None, agents: list[RunningAgent]
) -> None:
    if trainer is not None and trainer.poll() is None:
        trainer.kill()
        trainer.wait()
    if prom is not None:
        stop_prometheus(prom)
    for a in agents:
        stop_agent(a)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Two real agents (one node trains with the probe under `stallscope run`), a replayed GPU
    node, and a real Prometheus with the shipped recording rules scraping all three."""
    agents: list[RunningAgent] = []
    gpu: ReplayGpuNode | None = None
    prom: Prometheus | None = None
    trainer: subprocess.Popen[str] | None = None
    try:
        agents = [start_agent(tmp_path / "node0", interval="0.5")]
        with pytest.MonkeyPatch.context() as mp:
            # a node where nothing trains: a run index of its own, with nothing in it
            mp.setenv("STALLSCOPE_STATE_DIR", str(tmp_path / "idle-node-state"))
            agents.append(start_agent(tmp_path / "node1", interval="0.5"))
        gpu = ReplayGpuNode()
        targets = [f"127.0.0.1:{a.port}" for a in agents] + [f"127.0.0.1:{gpu.port}"]
        prom = start_prometheus(tmp_path, targets, RECORDING)
        out = tmp_path / "runs"
        # the trainer's run goes into the per-user run index (STALLSCOPE_STATE_DIR) that the
        # first agent follows
        trainer = subprocess.Popen(
            stallscope_argv(
                "run",
                "--interval",
                "1",
                "--out",
                str(out),
                "--",
                sys.executable,
                TRAIN,
                "--files",
                "400",
                "--max-seconds",
                "22",
                "--epochs",
                "100",
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
        )
        yield {
            "agents": agents,
            "gpu": gpu,
            "prom": prom,
            "trainer": trainer,
            "out": out,
            "targets": targets,
        }
    finally:
        if gpu is not None:
            gpu.stop()
        stop_all(trainer, prom, agents)


@pytest.mark.slow
@pytest.mark.prometheus
def test_cluster_rules_dashboard_steps_and_diagnose(cluster: dict[str, Any]) -> None:
    prom: Prometheus = cluster["prom"]
    trainer: subprocess.Popen[str] = cluster["trainer"]
    a0, a1 = cluster["agents"]
    gpu_target = cluster["targets"][2]
    # the probe's steps reach Prometheus through the agents, and the recording rules run
    wait_for(
        prom,
        {
            "steps": "stallscope_train_steps_total > 5",
            "data wait share": "rank:stallscope_train_data_wait:ratio_rate1m",
            "input-bound ranks": "cluster:stallscope_train_input_bound_ranks:ratio",
            "disk util": "instance_device:stallscope_disk_io_time:ratio_rate1m",
            "host cpu": "instance:stallscope_host_cpu_busy:ratio_rate1m",
            "gpu underused": "instance:stallscope_gpu_underused:ratio",
            "agent cpu": "instance:stallscope_agent_cpu:ratio_rate1m",
            # the trainer's processes, labelled with its run, rank and role
            "trainer process": 'stallscope_proc_cpu_seconds_total{role="main",rank="0"}',
            "worker processes": 'stallscope_proc_cpu_seconds_total{role="worker",rank="0"}',
        },
        40,
        [trainer, a0.proc, a1.proc],
    )
    workers = prom.query('stallscope_proc_resident_memory_bytes{role="worker"}')
    assert {r["metric"]["instance"] for r in workers} == {f"127.0.0.1:{a0.port}"}
    assert len({r["metric"]["run"] for r in workers}) == 1, workers
    share = prom.query("rank:stallscope_train_data_wait:ratio_rate1m")
    assert all(0 <= float(r["value"][1]) <= 1 for r in share), share
    assert {(r["metric"]["instance"], r["metric"]["rank"]) for r in share} == {
        (f"127.0.0.1:{a0.port}", "0")
    }
    # the replayed node: an RTX 2080 SUPER idle and an H100 under load -> half its GPUs idle
    underused = prom.query(f'instance:stallscope_gpu_underused:ratio{{instance="{gpu_target}"}}')
    assert [float(r["value"][1]) for r in underused] == [0.5]
    # its replayed drives: the ATA disk with 304 reallocated sectors and the NVMe are failing
    failing = {
        r["metric"]["device"]: float(r["value"][1])
        for r in prom.query(f'stallscope_smart_failing{{instance="{gpu_target}"}}')
    }
    assert failing == {"sda": 1.0, "nvme0": 1.0, "sdf": 0.0}, failing
    assert [
        float(r["value"][1])
        for r in prom.query('stallscope_smart_reallocated_sectors{device="sda"}')
    ] == [304.0]
    # every dashboard panel's PromQL parses and returns data while the training runs; a rate
    # over [1m] needs two scrapes of a series, so a panel may fill a scrape after its series
    # first arrived (CI once asked between the two)
    panels = {
        f"panel {i} {title!r}: {expr}": concrete(expr)
        for i, (title, expr) in enumerate(dashboard_targets())
    }
    wait_for(prom, panels, 20, [trainer, a0.proc, a1.proc])

    # the same training diagnosed from its run directory and from Prometheus
    here, there = both_diagnoses(trainer, cluster["out"], prom, a0.port)
    assert training_finding(there)["kind"] == training_finding(here)["kind"], (
        here["findings"],
        there["findings"],
    )
    assert training_finding(there)["kind"].startswith("input_bound"), here["findings"]
    assert there["stall_source"] == "probe"
    assert abs(there["stall_fraction"] - here["stall_fraction"]) <= 0.05, (
        here["stall_fraction"],
        there["stall_fraction"],
    )
    # every step the probe wrote reached Prometheus (the agent reads the run's steps table)
    assert there["signals"]["steps"] == here["signals"]["steps"]
    assert there["prometheus"]["instance"] == f"127.0.0.1:{a0.port}"
    # without --instance: one diagnosis per node; the GPU node's, from its replayed GPUs,
    # counts the busy H100 (100%) as the work's GPU and leaves the idle RTX out, as a local
    # run would
    r = subprocess.run(
        stallscope_argv(
            "diagnose", "--prometheus", prom.base, "--since", "2m", "--step", "1s", "--json"
        ),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    nodes = {d["prometheus"]["instance"]: d for d in json.loads(r.stdout)["nodes"]}
    assert set(nodes) == set(cluster["targets"])
    gpu_sig = nodes[gpu_target]["signals"]
    assert gpu_sig["gpus"] == 1 and gpu_sig["gpu_util_median_pct"] == 100, gpu_sig
    # the text form names the node and the run
    r = subprocess.run(
        stallscope_argv(
            "diagnose",
            "--prometheus",
            prom.base,
            "--instance",
            f"127.0.0.1:{a0.port}",
            "--since",
            "2m",
        ),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    assert f"node 127.0.0.1:{a0.port}" in r.stdout
    # the training's own verdict: first, or after a busy host's (as in its JSON form above)
    kind = training_finding(there)["kind"]
    assert f"verdict: {kind}" in r.stdout or f"also: {kind}" in r.stdout, r.stdout


@pytest.mark.slow
@pytest.mark.prometheus
def test_diagnose_over_prometheus_without_the_probe(tmp_path: Path) -> None:
    """An unchanged trainer (no probe) under `stallscope run`, whose one DataLoader worker cannot
    keep up: the agent exports its processes with their roles and its training thread's phase
    shares (its own sampled stacks), and `diagnose --prometheus` reaches the local verdict and
    stall from them."""
    agent = start_agent(tmp_path / "node", interval="0.5")
    prom: Prometheus | None = None
    trainer: subprocess.Popen[str] | None = None
    out = tmp_path / "runs"
    try:
        prom = start_prometheus(tmp_path, [f"127.0.0.1:{agent.port}"], None)
        trainer = subprocess.Popen(
            stallscope_argv(
                "run",
                "--interval",
                "1",
                "--out",
                str(out),
                "--",
                sys.executable,
                TRAIN,
                "--files",
                "400",
                "--max-seconds",
                "22",
                "--epochs",
                "100",
                "--workers",
                "1",
                "--prep-cost",
                "40",
                "--model",
                "tiny",
                "--no-probe",
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
        )
        wait_for(
            prom,
            {
                "worker": 'stallscope_proc_cpu_ratio{role="worker"}',
                "trainer": 'stallscope_proc_main_thread_active_ratio{role="main"}',
            },
            40,
            [trainer, agent.proc],
        )
        here, there = both_diagnoses(trainer, out, prom, agent.port)
        assert training_finding(here)["kind"] == "input_bound.prep", here["findings"]
        assert training_finding(there)["kind"] == training_finding(here)["kind"], (
            here["findings"],
            there["findings"],
        )
        # the trainer's own sampled stacks, exported by the agent, read back from Prometheus
        assert there["stall_source"] == here["stall_source"] == "stacks", (
            there["signals"].get("phase_shares"),
            here["signals"].get("phase_shares"),
        )
        assert abs(there["stall_fraction"] - here["stall_fraction"]) <= 0.1, (
            here["stall_fraction"],
            there["stall_fraction"],
        )
    finally:
        stop_all(trainer, prom, [agent])


@pytest.mark.slow
def test_agent_follows_another_users_training() -> None:
    """The agent as one unprivileged user (a `stallscope` system user, as the systemd unit
    runs it) and a training under `stallscope run` as another, with its own run index: listed
    in the agent's `run_indexes`, the run's steps (read-only SQLite on another user's WAL
    database) and processes reach /metrics; the trainer's /proc/PID/io is not readable across
    users, so its byte counters are left out, and nothing else fails."""
    import tempfile

    if os.geteuid() != 0:
        pytest.skip("needs root, to run the agent and the trainer as two other users")
    agent_uid, trainer_uid = 61946, 61945
    try:
        probe = subprocess.run(
            [sys.executable, "-c", "import stallscope"],
            user=trainer_uid,
            group=trainer_uid,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
            capture_output=True,
            text=True,
            cwd="/",
            check=False,
        )
        why = probe.stderr.strip()[-200:] if probe.returncode else ""
    except PermissionError as exc:
        why = str(exc)
    if why:
        pytest.skip(f"this Python cannot run as another user here: {why}")
    top = Path(tempfile.mkdtemp(prefix="stallscope-users-"))
    agent: subprocess.Popen[str] | None = None
    trainer: subprocess.Popen[str] | None = None
    try:
        top.chmod(0o777)
        port = free_port()
        config = top / "agent.toml"
        config.write_text(
            f'listen = "127.0.0.1:{port}"\ninterval_s = 0.5\n'
            f'store_dir = "{top}/agent-store"\n'
            f'run_indexes = ["{top}/state-*/runs.txt"]\n'
        )
        config.chmod(0o644)
        base = dict(os.environ, PYTHONPATH=str(ROOT), HOME=str(top))
        agent = subprocess.Popen(
            stallscope_argv("agent", "--config", str(config)),
            user=agent_uid,
            group=agent_uid,
            extra_groups=[],
            cwd=top,
            text=True,
            env=dict(base, STALLSCOPE_STATE_DIR=str(top / "agent-state")),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        trainer = subprocess.Popen(
            stallscope_argv(
                "run",
                "--interval",
                "1",
                "--out",
                str(top / "runs"),
                "--",
                sys.executable,
                TRAIN,
                "--files",
                "300",
                "--max-seconds",
                "12",
                "--epochs",
                "100",
            ),
            user=trainer_uid,
            group=trainer_uid,
            extra_groups=[],
            cwd=top,
            text=True,
            env=dict(base, STALLSCOPE_STATE_DIR=str(top / "state-alice")),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline, text = time.monotonic() + 40, ""
        # labels come sorted: the rank shows once the trainer's probe has reported
        want = ("stallscope_train_steps_total{", 'rank="0",role="worker"', 'rank="0",role="main"')
        while time.monotonic() < deadline:
            assert agent.poll() is None, agent.stderr.read() if agent.stderr else ""
            try:
                text = get(f"http://127.0.0.1:{port}/metrics")[2].decode()
            except OSError:
                text = ""
            if all(w in text for w in want):
                break
            time.sleep(0.5)
        assert all(w in text for w in want), text[-3000:]
        [run_dir] = list((top / "runs").iterdir())
        steps = [ln for ln in text.splitlines() if ln.startswith("stallscope_train_steps_total{")]
        assert f'run="{run_dir.name}"' in steps[0] and float(steps[0].rsplit(" ", 1)[1]) > 0
        procs = [
            ln for ln in text.splitlines() if ln.startswith("stallscope_proc_cpu_seconds_total{")
        ]
        assert {('rank="0"' in ln, f'run="{run_dir.name}"' in ln) for ln in procs} == {
            (True, True)
        }, procs
        assert "stallscope_proc_read_bytes_total{" not in text  # another user's /proc/PID/io
        trainer.communicate(timeout=120)
        assert trainer.returncode == 0
    finally:
        for p in (trainer, agent):
            if p is not None:
                terminate(p)
        shutil.rmtree(top, ignore_errors=True)


# --- bad input: one line each ---------------------------------------------------------------------


def one_line(r: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


def test_unreachable_prometheus_is_one_line() -> None:
    port = free_port()  # nothing listens there
    r = subprocess.run(
        stallscope_argv("diagnose", "--prometheus", f"http://127.0.0.1:{port}"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1
    assert f"cannot reach Prometheus at http://127.0.0.1:{port}" in one_line(r)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--prometheus", "127.0.0.1:9090"], "must be an http:// or https:// URL"),
        (["--prometheus", "http://127.0.0.1:1", "--since", "soon"], "--since must be a duration"),
        (["--prometheus", "http://127.0.0.1:1", "--instance", 'a"b'], "must not hold quotes"),
        ([], "diagnose needs RUN"),
    ],
)
def test_bad_prometheus_arguments_are_one_line(args: list[str], words: str) -> None:
    r = subprocess.run(
        stallscope_argv("diagnose", *args), capture_output=True, text=True, timeout=60
    )
    assert r.returncode != 0
    assert words in one_line(r)


@pytest.mark.prometheus
def test_prometheus_without_stallscope_series_is_one_line(tmp_path: Path) -> None:
    # a real Prometheus that scrapes only itself: it answers, but holds no stallscope series
    prom = start_prometheus(tmp_path, [], None)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                prom.query("up")
                break
            except OSError:
                time.sleep(0.3)
        r = subprocess.run(
            stallscope_argv(
                "diagnose", "--prometheus", prom.base, "--job", "stallscope", "--since", "5m"
            ),
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        stop_prometheus(prom)
    assert r.returncode == 1
    assert "holds no stallscope series" in one_line(r)


# --- deploy files: systemd, container, Kubernetes -------------------------------------------------


def agent_args_parse(args: list[str]) -> Any:
    """The agent's own parser accepts these arguments (as the image or the unit passes them)."""
    from stallscope.cli import build_parser

    ns = build_parser().parse_args(["agent", *args])
    assert ns.func.__module__ == "stallscope.cli.agent"
    return ns


def test_systemd_unit_verifies_and_grants_nothing(tmp_path: Path) -> None:
    unit = (ROOT / "deploy" / "systemd" / "stallscope-agent.service").read_text()
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        tool_missing("systemd-analyze (Debian package systemd)")
        return
    exec_start = re.search(r"^ExecStart=/opt/stallscope/bin/stallscope agent (.*)$", unit, re.M)
    assert exec_start, "ExecStart must run the venv's /opt/stallscope/bin/stallscope"
    ns = agent_args_parse(exec_start.group(1).split())
    assert ns.listen.startswith("127.0.0.1:")
    # verify needs the command to exist: the same unit with this checkout's interpreter
    local = tmp_path / "stallscope-agent.service"
    local.write_text(
        unit.replace(
            "/opt/stallscope/bin/stallscope", f"{os.path.realpath(sys.executable)} -m stallscope"
        )
    )
    r = subprocess.run([analyze, "verify", str(local)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and not r.stderr.strip(), r.stdout + r.stderr
    settings = dict(re.findall(r"^(\w+)=(.*)$", unit, re.M))
    assert settings["CapabilityBoundingSet"] == "" and settings["AmbientCapabilities"] == ""
    assert settings["DynamicUser"] == "yes" and settings["NoNewPrivileges"] == "yes"
    assert settings["KillSignal"] == "SIGTERM"


def test_the_smart_drop_in_takes_effect(tmp_path: Path) -> None:
    """systemd's own reading of the unit with and without the drop-in (`systemd-analyze
    security --offline`, which merges drop-ins as systemd does): the unit alone has neither
    capability smartctl needs; with smart.conf beside it, both, and it runs as root."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        tool_missing("systemd-analyze (Debian package systemd)")
        return
    unit = (ROOT / "deploy" / "systemd" / "stallscope-agent.service").read_text()
    unit = unit.replace(
        "/opt/stallscope/bin/stallscope", f"{os.path.realpath(sys.executable)} -m stallscope"
    )

    def allowed(with_drop_in: bool) -> dict[str, bool]:
        d = tmp_path / ("with" if with_drop_in else "without")
        d.mkdir()
        (d / "stallscope-agent.service").write_text(unit)
        if with_drop_in:
            (d / "stallscope-agent.service.d").mkdir()
            shutil.copy(
                ROOT / "deploy" / "systemd" / "stallscope-agent.service.d" / "smart.conf",
                d / "stallscope-agent.service.d" / "smart.conf",
            )
        r = subprocess.run(
            [
                analyze,
                "security",
                "--offline=true",
                "--json=short",
                str(d / "stallscope-agent.service"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        items = {x["name"]: x for x in json.loads(r.stdout)}
        # "set": the restriction is in force (the capability is removed)
        return {
            cap: not items[f"CapabilityBoundingSet=~{cap}"]["set"]
            for cap in ("CAP_SYS_RAWIO", "CAP_SYS_ADMIN", "CAP_SYS_PTRACE", "CAP_NET_ADMIN")
        }

    assert allowed(False) == {
        "CAP_SYS_RAWIO": False,
        "CAP_SYS_ADMIN": False,
        "CAP_SYS_PTRACE": False,
        "CAP_NET_ADMIN": False,
    }
    assert allowed(True) == {
        "CAP_SYS_RAWIO": True,
        "CAP_SYS_ADMIN": True,
        "CAP_SYS_PTRACE": False,
        "CAP_NET_ADMIN": False,
    }
    drop_in = ROOT / "deploy" / "systemd" / "stallscope-agent.service.d" / "smart.conf"
    assert "User=root" in drop_in.read_text()


def test_containerfile_builds_a_non_root_agent_image() -> None:
    text = (ROOT / "deploy" / "container" / "Containerfile").read_text()
    lines = [
        ln
        for ln in text.replace("\\\n", " ").splitlines()
        if ln.strip() and not ln.lstrip().startswith("#")
    ]
    instr = [
        (ln.split(None, 1)[0], ln.split(None, 1)[1] if " " in ln.strip() else "") for ln in lines
    ]
    known = {
        "FROM",
        "RUN",
        "COPY",
        "ENV",
        "USER",
        "VOLUME",
        "EXPOSE",
        "ENTRYPOINT",
        "CMD",
        "WORKDIR",
        "ARG",
        "LABEL",
    }
    assert all(k in known for k, _ in instr), instr
    assert instr[0][0] == "FROM"
    for k, rest in instr:
        if k == "COPY":  # the build context is the repository root
            *srcs, _dst = rest.split()
            assert all((ROOT / s).exists() for s in srcs), rest
    user = [rest for k, rest in instr if k == "USER"]
    assert user and not user[-1].startswith(("root", "0")), user
    entry = json.loads(next(rest for k, rest in instr if k == "ENTRYPOINT"))
    cmd = json.loads(next(rest for k, rest in instr if k == "CMD"))
    assert entry == ["stallscope", "agent"]
    agent_args_parse(cmd)
    assert "10127" in next(rest for k, rest in instr if k == "EXPOSE")


def test_kubernetes_daemonset(tmp_path: Path) -> None:
    from stallscope.agent.config import load_config

    docs = list(
        yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / "stallscope-agent.yaml").read_text())
    )
    kinds = {d["kind"]: d for d in docs}
    assert set(kinds) == {"ConfigMap", "DaemonSet", "Service", "ServiceMonitor"}
    for d in docs:
        assert d["apiVersion"] and d["metadata"]["name"] and d["metadata"]["namespace"]
    ds = kinds["DaemonSet"]
    assert ds["apiVersion"] == "apps/v1"
    spec = ds["spec"]
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    pod = spec["template"]["spec"]
    assert pod["hostPID"] is True
    # the pod's own network: no port of the node is bound (no hostNetwork, no hostPort)
    assert not pod.get("hostNetwork") and "hostPort" not in str(pod)
    assert pod["priorityClassName"] == "system-node-critical"
    # uid 0 only for the kubelet's root-owned socket: every capability dropped
    [c] = pod["containers"]
    assert c["image"] and c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert (
        "privileged" not in c["securityContext"]
        and "add" not in c["securityContext"]["capabilities"]
    )
    assert "nvidia.com/gpu" not in str(c.get("resources")), "must not take a GPU from jobs"
    # $(POD_IP) and $(NODE_NAME) are expanded by the kubelet from the downward API
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"] if "valueFrom" in e}
    assert env == {"POD_IP": "status.podIP", "NODE_NAME": "spec.nodeName"}
    args = [
        a.replace("$(POD_IP)", "10.244.3.17").replace("$(NODE_NAME)", "gpu-node-7")
        for a in c["args"]
    ]
    assert all("$(" not in a for a in args)
    ns = agent_args_parse(args)
    assert ns.listen == "10.244.3.17:10127" and ns.hostname == "gpu-node-7"
    assert {p["containerPort"] for p in c["ports"]} == {10127}
    # the kubelet's pod-resources socket, read-only, where the agent looks by default
    from stallscope.sources.podresources import DEFAULT_SOCKET

    pr = next(m for m in c["volumeMounts"] if m["name"] == "pod-resources")
    assert pr["readOnly"] is True and DEFAULT_SOCKET.startswith(pr["mountPath"] + "/")
    # the Service and ServiceMonitor find the pods' metrics port
    svc, mon = kinds["Service"], kinds["ServiceMonitor"]
    assert svc["spec"]["selector"].items() <= spec["template"]["metadata"]["labels"].items()
    assert svc["spec"]["ports"][0]["targetPort"] == c["ports"][0]["name"]
    assert mon["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert mon["spec"]["endpoints"][0]["port"] == svc["spec"]["ports"][0]["name"]
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["path"] == "/api/v1/health"
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert set(mounts) <= set(volumes), "a mount without its volume"
    assert ns.config.startswith(mounts["config"]["mountPath"] + "/")
    cm = kinds["ConfigMap"]
    assert volumes["config"]["configMap"]["name"] == cm["metadata"]["name"]
    # the config the pod reads is one the agent accepts
    toml = tmp_path / "agent.toml"
    toml.write_text(cm["data"][Path(ns.config).name])
    cfg = load_config(toml)
    assert cfg.run_indexes and all(
        p.startswith(mounts["runs"]["mountPath"]) for p in cfg.run_indexes
    )
    annotations = spec["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == ns.listen.rsplit(":", 1)[1]


def test_gpu_series_carry_the_pci_bus_id() -> None:
    # dcgm-exporter's pci_bus_id label, from nvmlDeviceGetPciInfo (replayed: the captures'
    # pci.bus_id), so panels and joins on it work
    from prometheus_client import generate_latest

    from stallscope.agent.exporter import PrometheusSink
    from stallscope.collect import Collector
    from stallscope.sources.gpu import GpuSource
    from stallscope.testing.nvml_replay import NvmlReplay

    replay = NvmlReplay.load(FIXTURES / RTX_IDLE_POWER_CAP, FIXTURES / H100_LOAD)
    want = [d["nvmlDeviceGetPciInfo"]["busId"] for d in replay.devices]
    assert all(re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]", w) for w in want)
    gpu = GpuSource(backend=replay)
    gpu.open()
    sink = PrometheusSink(["gpu"], hostname="n")
    c = Collector([gpu], [sink], interval=1.0)
    sample = c.sample_once()
    assert [g["pci_bus_id"] for g in sample.readings["gpu"].payload] == want
    text = generate_latest(sink.registry).decode()
    for i, bus in enumerate(want):
        assert re.search(
            rf'stallscope_gpu_utilization_ratio\{{[^}}]*gpu="{i}"[^}}]*'
            rf'pci_bus_id="{re.escape(bus)}"',
            text,
        ) or re.search(
            rf'stallscope_gpu_utilization_ratio\{{[^}}]*pci_bus_id="{re.escape(bus)}"[^}}]*'
            rf'gpu="{i}"',
            text,
        ), text
    c.stop(final_sample=False)


@pytest.mark.slow
def test_a_wheel_installs_into_a_fresh_venv_and_runs_the_agent(tmp_path: Path) -> None:
    """What the systemd section tells an operator to do, for real: build the wheel, install it
    into a new virtual environment (as /opt/stallscope), and run from there the commands a
    fleet install uses: the agent serving /metrics, and the packaged alerting rules."""
    dist = tmp_path / "dist"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(dist),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    [wheel] = list(dist.glob("stallscope-*.whl"))
    venv = tmp_path / "opt-stallscope"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    # its dependencies downloaded beside it; the wheel itself is what is tested
    r = subprocess.run(
        [
            str(venv / "bin" / "pip"),
            "install",
            "-q",
            "--no-index",
            "--find-links",
            str(dist),
            *_dependency_wheels(tmp_path),
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    exe = venv / "bin" / "stallscope"
    rules = subprocess.run(
        [str(exe), "alerts", "prometheus"], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert rules.returncode == 0 and "StallscopeGpuHot" in rules.stdout, rules.stderr
    port = free_port()
    agent = subprocess.Popen(
        [
            str(exe),
            "agent",
            "--listen",
            f"127.0.0.1:{port}",
            "--interval",
            "0.5",
            "--store",
            str(tmp_path / "store"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    try:
        assert "stallscope_host_cpu_seconds_total" in first_metrics(
            agent, port, "stallscope_host_cpu_seconds_total"
        )
    finally:
        terminate(agent)


def _dependency_wheels(tmp: Path) -> list[str]:
    """The core dependencies as wheels in a folder (`pip download`: pip's cache or the index),
    for the fresh environment's `--no-index` install."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    deps = tmp / "deps"
    core = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    r = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "-d", str(deps), *core],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return ["--find-links", str(deps)]
