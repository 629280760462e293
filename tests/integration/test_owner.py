"""Whose job a process is: /proc/PID/cgroup recorded on real nodes (tests/fixtures/cgroup/),
real processes placed in real cgroups named as kubelet and Slurm name them, and a real gRPC
server speaking the kubelet's pod-resources v1 API on a unix socket."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXTURES

from stallscope.sources.owner import (
    Owner,
    OwnerCache,
    describe,
    owner_from_env,
    parse_cgroup,
    read_owner,
)
from stallscope.sources.podresources import (
    LIST_METHOD,
    PodResources,
    containers_of,
    device_owners,
)

CGROUPS = FIXTURES / "cgroup"

#: file -> (pod uid, container id, runtime)
RECORDED = {
    "k8s-v1-containerd-systemd-otel4507.txt": (
        "0125ec2f-b64a-4868-8f5b-94b56cbab864",
        "ee4b20e90ac7f42a10bd004d05646b13d8ab5e2c5e7cbc01abf8006bac016459",
        "containerd",
    ),
    "k8s-v1-crio-systemd-runc4620.txt": (
        "a5c1f8d5-1919-434d-add7-4afaafdaef89",
        "5eed917563583925ffdbd40a64efb2aaffe58638e57add8becaf460fe74f5b1c",
        "cri-o",
    ),
    "k8s-v1-docker-systemd-lxc3890.txt": (
        "7d4424e6-bb13-42f4-a47a-45a4828bf54d",
        "d0b3604b67ac7930dd34ba3a796627e3e4717d12309e90a4afe3f38b6816ac98",
        "docker",
    ),
    "k8s-v2-containerd-kind-nri227.txt": (
        "1e597579-417e-482f-bf65-5fe170c3aebd",
        "a09bc17f5aa29b0dbdec9ede5f46cf1396d2405917ab02e6f1eb1019f388396e",
        "containerd",
    ),
    "k8s-v2-containerd-static-pod-netdata4868.txt": (
        "8daa50c3a64c9ff60bb9eab7b44b56fd",
        "2884d57c0e100d7a9a2f9487ce0bc2986bca3430e988af7a4865aff061f51ac5",
        "containerd",
    ),
    "k8s-v2-crio-minikube11280.txt": (
        "ae7a96fb-2bdc-46b0-96e2-78e4af94847b",
        "89e8f450417b56acf3089925dfd8f050dd50e950e18cfe83ea923269df601102",
        "cri-o",
    ),
}


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_recorded_cgroup_files_of_real_nodes(name: str) -> None:
    o = parse_cgroup((CGROUPS / name).read_text())
    assert (o.pod_uid, o.container_id, o.runtime) == RECORDED[name]
    assert o.hpc_job is None and o.known


def test_every_recorded_file_is_tested() -> None:
    files = {p.name for p in CGROUPS.glob("*.txt")}
    assert files == set(RECORDED) | {"not-owned-talos3950.txt"}


@pytest.mark.parametrize(
    "text",
    [
        (CGROUPS / "not-owned-talos3950.txt").read_text(),
        "0::/\n",
        "",
        "garbage\n::\n1:cpu\n",
        "0::/user.slice/user-1000.slice/session-3.scope\n",
        "\x00\xff" * 50,
        "0::/kubepods/podNOTAUID/x\n",
        "4:cpu:/slurm/uid_0/job_abc/step_0\n",
    ],
)
def test_nothing_owned_is_an_empty_owner(text: str) -> None:
    o = parse_cgroup(text)
    assert o == Owner() and not o.known and o.attrs() == {}


@pytest.mark.parametrize(
    ("path", "job", "step"),
    [
        ("/slurm/uid_1000/job_4242/step_0/task_0", "4242", "0"),  # v1
        ("/slurm_node-a/uid_0/job_77/step_batch", "77", "batch"),  # v1, multiple slurmd
        ("/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0", "4242", "0"),  # v2
        ("/system.slice/node-a_slurmstepd.scope/job_9/step_extern", "9", "extern"),
        ("/system.slice/slurmstepd.scope/job_5", "5", None),  # the job's own level
    ],
)
def test_slurm_layouts(path: str, job: str, step: str | None) -> None:
    for line in (f"0::{path}\n", f"4:memory:{path}\n3:cpuset:/\n"):
        o = parse_cgroup(line)
        assert (o.hpc_job, o.step, o.pod_uid) == (job, step, None), line
        assert o.attrs() == {"hpc_job": job}
    assert describe(parse_cgroup(f"0::{path}").attrs()) == f"job {job}"


def test_environment_names_the_slurm_job_pod_and_gpus() -> None:
    o = owner_from_env(
        {
            "SLURM_JOB_ID": "4242",
            "SLURM_STEP_ID": "0",
            "NVIDIA_VISIBLE_DEVICES": "GPU-aaa,MIG-bbb,3",
            "POD_NAME": "trainer-0",
            "POD_NAMESPACE": "team-a",
        }
    )
    assert o.attrs() == {"namespace": "team-a", "pod": "trainer-0", "hpc_job": "4242"}
    assert o.gpus == ("GPU-aaa", "MIG-bbb") and o.names_from == "environment"
    assert owner_from_env({"SLURM_JOBID": "7"}).hpc_job == "7"  # older Slurm
    assert owner_from_env({"SLURM_JOB_ID": "$(rm -rf /)"}).hpc_job is None  # not an id
    assert owner_from_env({"NVIDIA_VISIBLE_DEVICES": "all"}).gpus == ()
    assert (
        describe({"namespace": "team-a", "pod": "trainer-0", "container": "pytorch"})
        == "pod team-a/trainer-0 (container pytorch)"
    )
    assert describe({"pod_uid": "1e597579-417e"}) == "pod 1e597579…"
    assert describe({}) == describe(None) == ""


# --- real cgroups -------------------------------------------------------------------------------

CPU = Path("/sys/fs/cgroup/cpu")


@pytest.fixture
def real_cgroup(request: pytest.FixtureRequest) -> Iterator[Any]:
    """Make a nested cgroup v1 path under the cpu hierarchy (root only), yield a function that
    starts a process in it; everything is moved back and removed after."""
    if os.geteuid() != 0 or not (CPU / "cgroup.procs").exists():
        pytest.skip("placing a process in a cgroup needs root and a cgroup v1 cpu hierarchy")
    made: list[Path] = []
    procs: list[subprocess.Popen[bytes]] = []

    def start(rel: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        d = CPU / rel.strip("/")
        parts = d.relative_to(CPU).parts
        for i in range(1, len(parts) + 1):
            p = CPU.joinpath(*parts[:i])
            if not p.exists():
                p.mkdir()
                made.append(p)
        base = {k: v for k, v in os.environ.items() if k not in ("HOSTNAME", "SLURM_JOB_ID")}
        proc = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(60)"], env={**base, **(env or {})}
        )
        procs.append(proc)
        (d / "cgroup.procs").write_text(str(proc.pid))
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()
    for p in reversed(made):
        for _ in range(50):
            try:
                p.rmdir()
                break
            except OSError:
                time.sleep(0.05)


UID = "1e597579-417e-482f-bf65-5fe170c3aebd"
CID = "a09bc17f5aa29b0dbdec9ede5f46cf1396d2405917ab02e6f1eb1019f388396e"


@pytest.mark.root
def test_a_process_in_a_kubelet_cgroupfs_cgroup(real_cgroup: Any) -> None:
    proc = real_cgroup(f"kubepods/burstable/pod{UID}/{CID}")
    o = read_owner(proc.pid)
    assert (o.pod_uid, o.container_id) == (UID, CID)
    assert describe(o.record()) == "pod 1e597579…"
    # inside a pod the host name is the pod's name (kubelet sets it so)
    named = read_owner(
        real_cgroup(f"kubepods/burstable/pod{UID}/{CID}", env={"HOSTNAME": "trainer-0"}).pid
    )
    assert (named.pod, named.names_from, named.pod_uid) == ("trainer-0", "environment", UID)
    # the same host name outside a pod names nothing
    assert read_owner(real_cgroup("elsewhere", env={"HOSTNAME": "trainer-0"}).pid) == Owner()


@pytest.mark.root
def test_a_process_in_a_slurm_step_cgroup_with_its_environment(real_cgroup: Any) -> None:
    proc = real_cgroup("slurm/uid_0/job_4242/step_0/task_0", env={"SLURM_JOB_ID": "4242"})
    o = read_owner(proc.pid)
    assert (o.hpc_job, o.step) == ("4242", "0")
    # the same process read through the cache; a pid that is gone is an empty owner
    cache = OwnerCache()
    assert cache.owner(proc.pid) == o
    assert read_owner(2**22 + 5) == Owner()


# --- the kubelet's pod-resources API, served for real over gRPC on a unix socket --------------

#: the v1 answer with fields stallscope does not read (cpu_ids, topology, memory), built from the
#: published proto's full declarations independently of the client's
_FULL_PROTO = """
ListPodResourcesResponse: pod_resources=1:PodResources*
PodResources: name=1:string namespace=2:string containers=3:ContainerResources*
ContainerResources: name=1:string devices=2:ContainerDevices* cpu_ids=3:int64*
ContainerResources: memory=4:ContainerMemory*
ContainerDevices: resource_name=1:string device_ids=2:string* topology=3:TopologyInfo
ContainerMemory: memory_type=1:string size=2:uint64 topology=3:TopologyInfo
TopologyInfo: nodes=1:NUMANode*
NUMANode: ID=1:int64
"""


def _server_messages() -> dict[str, Any]:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    scalar = {"string": F.TYPE_STRING, "int64": F.TYPE_INT64, "uint64": F.TYPE_UINT64}
    fdp = descriptor_pb2.FileDescriptorProto(
        name="kubelet/podresources/v1/api.proto", package="v1", syntax="proto3"
    )
    fdp.message_type.add(name="ListPodResourcesRequest")
    made: dict[str, Any] = {}
    for line in _FULL_PROTO.strip().splitlines():
        name, fields = line.split(":", 1)
        msg = made.get(name) or made.setdefault(name, fdp.message_type.add(name=name))
        for spec in fields.split():
            fname, rest = spec.split("=")
            num, kind = rest.split(":")
            rep = kind.endswith("*")
            kind = kind.rstrip("*")
            f = msg.field.add(
                name=fname, number=int(num), label=F.LABEL_REPEATED if rep else F.LABEL_OPTIONAL
            )
            if kind in scalar:
                f.type = scalar[kind]
            else:
                f.type, f.type_name = F.TYPE_MESSAGE, f".v1.{kind}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return {
        n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"v1.{n}"))
        for n in ("ListPodResourcesRequest", "ListPodResourcesResponse")
    }


PODS = {
    "pod_resources": [
        {
            "name": "trainer-0",
            "namespace": "team-a",
            "containers": [
                {
                    "name": "pytorch",
                    "cpu_ids": [2, 3],
                    "devices": [
                        {
                            "resource_name": "nvidia.com/gpu",
                            "device_ids": ["GPU-58e8f5ea-13cc-013a-d88f-2bcf5ae8bc77"],
                            "topology": {"nodes": [{"ID": 0}]},
                        }
                    ],
                },
                {"name": "sidecar", "memory": [{"memory_type": "memory", "size": 1 << 30}]},
            ],
        },
        {
            "name": "embed-7f",
            "namespace": "serving",
            "containers": [
                {
                    "name": "kserve-container",
                    "devices": [
                        {
                            "resource_name": "nvidia.com/mig-1g.10gb",
                            "device_ids": ["MIG-0c4a5a2e-7a5e-5d4c-9a63-3b1a2f0e6d11"],
                        }
                    ],
                }
            ],
        },
    ]
}


class Kubelet:
    """A real grpcio server on a unix socket answering v1.PodResourcesLister/List."""

    def __init__(self, path: Path, doc: dict[str, Any]) -> None:
        import grpc
        from google.protobuf import json_format

        msgs = _server_messages()
        reply = json_format.ParseDict(doc, msgs["ListPodResourcesResponse"]())
        self.calls = 0

        def list_pods(_request: Any, _context: Any) -> Any:
            self.calls += 1
            return reply

        handler = grpc.method_handlers_generic_handler(
            "v1.PodResourcesLister",
            {
                "List": grpc.unary_unary_rpc_method_handler(
                    list_pods,
                    request_deserializer=msgs["ListPodResourcesRequest"].FromString,
                    response_serializer=lambda m: m.SerializeToString(),
                )
            },
        )
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self.server.add_generic_rpc_handlers((handler,))
        self.server.add_insecure_port(f"unix://{path}")
        self.server.start()

    def stop(self) -> None:
        self.server.stop(0)


def test_pod_resources_over_a_real_grpc_socket(tmp_path: Path) -> None:
    sock = tmp_path / "kubelet.sock"
    kubelet = Kubelet(sock, PODS)
    try:
        client = PodResources(str(sock), refresh_s=60)
        assert LIST_METHOD == "/v1.PodResourcesLister/List"
        conts = client.containers()
        assert client.problem is None
        assert [(c.namespace, c.pod, c.container) for c in conts] == [
            ("team-a", "trainer-0", "pytorch"),
            ("team-a", "trainer-0", "sidecar"),
            ("serving", "embed-7f", "kserve-container"),
        ]
        owners = client.device_owners()
        assert owners["GPU-58e8f5ea-13cc-013a-d88f-2bcf5ae8bc77"] == {
            "namespace": "team-a",
            "pod": "trainer-0",
            "container": "pytorch",
        }
        assert owners["MIG-0c4a5a2e-7a5e-5d4c-9a63-3b1a2f0e6d11"]["pod"] == "embed-7f"
        client.containers()
        assert kubelet.calls == 1  # kept for refresh_s
        client.close()
    finally:
        kubelet.stop()
    # the same answer from its JSON shape (recorded answers, tests)
    assert device_owners(containers_of(PODS)) == owners


def test_a_process_is_named_after_the_container_holding_its_gpus(tmp_path: Path) -> None:
    sock = tmp_path / "kubelet.sock"
    kubelet = Kubelet(sock, PODS)
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env={**os.environ, "NVIDIA_VISIBLE_DEVICES": "GPU-58e8f5ea-13cc-013a-d88f-2bcf5ae8bc77"},
    )
    try:
        cache = OwnerCache(kubelet=PodResources(str(sock)))
        o = cache.owner(proc.pid)
        assert o.attrs() == {"namespace": "team-a", "pod": "trainer-0", "container": "pytorch"}
        assert o.names_from == "kubelet"
        assert describe(o.record()) == "pod team-a/trainer-0 (container pytorch)"
    finally:
        proc.kill()
        proc.wait()
        kubelet.stop()


def test_no_kubelet_is_one_line_and_no_names(tmp_path: Path) -> None:
    client = PodResources(str(tmp_path / "absent.sock"), timeout_s=0.5)
    assert client.containers() == []
    assert client.problem is not None and "\n" not in client.problem
    assert client.problem.startswith(f"the kubelet's pod-resources API at {tmp_path}")
    # a socket that answers garbage: no traceback, one line
    import socket as so

    path = tmp_path / "garbage.sock"
    srv = so.socket(so.AF_UNIX, so.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(1)
    try:
        bad = PodResources(str(path), timeout_s=0.5)
        assert bad.containers() == [] and bad.problem and "\n" not in bad.problem
    finally:
        srv.close()


# --- end to end: what the agent exports and what `run`, `runs` and `diagnose` say ------------


def test_the_agent_labels_steps_processes_and_gpus_with_their_owner(tmp_path: Path) -> None:
    """A followed run of Slurm job 4242 (meta.json ``owner``): its step and process series carry
    ``hpc_job``; a GPU the kubelet (a real gRPC server) gives to pod team-a/trainer-0 carries
    that pod's labels, as dcgm-exporter's would."""
    import json

    from prometheus_client import generate_latest
    from test_agent_steps import add_steps, make_run

    from stallscope.agent.exporter import PrometheusSink
    from stallscope.agent.steps import StepFollower
    from stallscope.agent.trainprocs import TrainerProcs
    from stallscope.collect import Collector
    from stallscope.sources.gpu import GpuSource
    from stallscope.store.index import record_run
    from stallscope.testing.nvml_replay import NvmlReplay

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    sock = tmp_path / "kubelet.sock"
    kubelet = Kubelet(sock, PODS)
    try:
        run = make_run(tmp_path / "runs", pid=sleeper.pid)
        meta = json.loads((run / "meta.json").read_text())
        meta["owner"] = {"hpc_job": "4242", "step": "0"}
        (run / "meta.json").write_text(json.dumps(meta))
        record_run(run)
        add_steps(run, 0, 0, 3, 0.1, 0.1)
        doc = json.loads(
            (
                FIXTURES / "nvml-replay-h100-80gb-hbm3-load-from-nvidia-smi-590.48.01.json"
            ).read_text()
        )
        doc["devices"][0]["nvmlDeviceGetUUID"] = "GPU-58e8f5ea-13cc-013a-d88f-2bcf5ae8bc77"
        (tmp_path / "replay.json").write_text(json.dumps(doc))
        gpu = GpuSource(backend=NvmlReplay.load(tmp_path / "replay.json"))
        gpu.open()
        follower = StepFollower(rescan_s=0)
        client = PodResources(str(sock))
        procs = TrainerProcs(follower, kubelet=client)
        procs.open()
        sink = PrometheusSink(
            ["gpu", "procs"], hostname="node-a", steps=follower, gpu_owners=client.device_owners
        )
        collector = Collector([gpu, procs], [sink], interval=0.2)
        collector.start()
        deadline = time.monotonic() + 20
        text = ""
        while time.monotonic() < deadline:
            text = generate_latest(sink.registry).decode()
            if "stallscope_proc_cpu_ratio{" in text and "stallscope_gpu_power_watts{" in text:
                break
            time.sleep(0.2)
        collector.stop(final_sample=False)
    finally:
        sleeper.kill()
        sleeper.wait()
        kubelet.stop()
    lines = text.splitlines()
    step = next(ln for ln in lines if ln.startswith("stallscope_train_steps_total{"))
    assert 'hpc_job="4242"' in step and 'Hostname="node-a"' in step, step
    proc = next(ln for ln in lines if ln.startswith("stallscope_proc_cpu_ratio{"))
    assert f'pid="{sleeper.pid}"' in proc and 'run="' in proc, proc
    power = next(ln for ln in lines if ln.startswith("stallscope_gpu_power_watts{"))
    for label in (
        'namespace="team-a"',
        'pod="trainer-0"',
        'container="pytorch"',
        'UUID="GPU-58e8f5ea-13cc-013a-d88f-2bcf5ae8bc77"',
    ):
        assert label in power, power


@pytest.mark.root
@pytest.mark.slow
def test_run_runs_and_diagnose_name_the_slurm_job(tmp_path: Path, real_cgroup: Any) -> None:
    """`stallscope run` started inside Slurm job 4242's step cgroup (made for real, named as
    slurmd names it): meta.json records the owner, `runs` has an owner column, and the
    diagnosis starts with whose run it is."""
    import json
    import socket

    from conftest import stallscope_argv

    out = tmp_path / "runs"
    holder = real_cgroup("slurm/uid_0/job_4242/step_0/task_0")  # makes the path
    holder.kill()
    procs_file = CPU / "slurm/uid_0/job_4242/step_0/task_0/cgroup.procs"
    # join the cgroup, then become `stallscope run` (the trainer inherits the cgroup)
    argv = [
        *stallscope_argv("run", "--interval", "0.5", "--no-stacks", "--out", str(out)),
        "--",
        sys.executable,
        "-c",
        "import time; time.sleep(2)",
    ]
    boot = (
        "import os, sys; open(sys.argv[1], 'w').write(str(os.getpid())); "
        "os.execvp(sys.argv[2], sys.argv[2:])"
    )
    try:
        r = subprocess.run(
            [sys.executable, "-c", boot, str(procs_file), *argv],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        pass
    assert r.returncode == 0, r.stderr[-2000:]
    [run_dir] = list(out.iterdir())
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["owner"]["hpc_job"] == "4242" and meta["owner"]["step"] == "0"
    rs = subprocess.run(
        stallscope_argv("runs", "--out", str(out)),
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "160"},
    )
    assert "owner" in rs.stdout and "job 4242" in rs.stdout, rs.stdout
    d = subprocess.run(
        stallscope_argv("diagnose", str(run_dir)), capture_output=True, text=True, timeout=60
    )
    first = d.stdout.splitlines()[0]
    assert first.startswith(f"job 4242 on {socket.gethostname()} is "), d.stdout
    dj = json.loads(
        subprocess.run(
            stallscope_argv("diagnose", str(run_dir), "--json"),
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    )
    assert dj["owner"]["hpc_job"] == "4242" and dj["host"] == socket.gethostname()


def test_diagnose_over_prometheus_names_the_owner_from_the_step_labels() -> None:
    """The agent's step series carry the run's owner (hpc_job here): `diagnose --prometheus`
    reads it back, and the diagnosis begins with it, as a local one does."""
    from stallscope.analysis.diagnose import diagnose, owner_lead
    from stallscope.analysis.promdata import PromQuery, _node_run, _Scraped

    t0 = 1_700_000_000.0
    scraped = _Scraped()
    base = {
        "instance": "gpu-node-7:10127",
        "job": "stallscope",
        "run": "r1",
        "Hostname": "gpu-node-7",
        "hpc_job": "4242",
    }
    for rank, wait in ((0, 0.02), (1, 0.9)):
        cols = {
            "stallscope_train_steps_total": [i * 10 for i in range(40)],
            "stallscope_train_step_seconds_total": [i * 10.0 for i in range(40)],
            "stallscope_train_data_wait_seconds_total": [i * 10.0 * wait for i in range(40)],
        }
        for name, vals in cols.items():
            scraped.add(
                {
                    "metric": {"__name__": name, **base, "rank": str(rank)},
                    "values": [[t0 + 15 * i, str(v)] for i, v in enumerate(vals)],
                }
            )
    q = PromQuery(url="http://prometheus:9090", since_s=600, step_s=15)
    data = _node_run(q, scraped, "gpu-node-7:10127", t0, t0 + 600, 15.0)
    assert data.meta["owner"] == {"hpc_job": "4242"}
    doc = diagnose(data)
    lead = owner_lead(doc)
    assert lead is not None and lead.startswith("job 4242, rank 1 on gpu-node-7 is "), lead


def test_diagnose_over_prometheus_names_changes_from_the_window_and_keeps_its_hint() -> None:
    """Over Prometheus the time axis starts at the window, not at the run: a change is placed
    "into the window read from Prometheus" (it said "1764 s into the run" of a 90 s run)."""
    from stallscope.analysis.diagnose import diagnose
    from stallscope.analysis.promdata import PromQuery, _node_run, _Scraped

    t0 = 1_700_000_000.0
    scraped = _Scraped()
    base = {"instance": "n1:10127", "job": "stallscope", "run": "r1", "rank": "0"}
    n = 80
    steps = [i * 10 for i in range(n)]
    step_s = [0.0]
    for i in range(1, n):  # steps of 0.1 s, then of 0.4 s from the middle on
        step_s.append(step_s[-1] + (1.0 if i < n // 2 else 4.0))
    for name, vals in (
        ("stallscope_train_steps_total", steps),
        ("stallscope_train_step_seconds_total", step_s),
        ("stallscope_train_data_wait_seconds_total", [v * 0.1 for v in step_s]),
    ):
        scraped.add(
            {
                "metric": {"__name__": name, **base},
                "values": [[t0 + 15 * i, str(v)] for i, v in enumerate(vals)],
            }
        )
    q = PromQuery(url="http://p:9090", since_s=1800, step_s=15)
    doc = diagnose(_node_run(q, scraped, "n1:10127", t0 - 600, t0 + 15 * n, 15.0))
    summaries = [c["summary"] for c in doc["changes"]]
    assert summaries and all("into the window read from Prometheus" in s for s in summaries), (
        summaries
    )
