"""Whose job a process is: the Kubernetes pod and container, or the Slurm job, it runs in.

On a shared GPU fleet a stall is useful only if it says whose it is. Every process tells the
kernel's view of that in ``/proc/PID/cgroup`` (world-readable): kubelet puts each container in
a cgroup named after its pod's UID and its container id, and Slurm puts each job step in one
named after the job id. This module reads those names (pure parsers over the text, tested on
recorded files of real nodes and on real cgroups made here), and the environment where the
same user may read it (``SLURM_JOB_ID``; ``NVIDIA_VISIBLE_DEVICES``, the GPUs the device plugin
gave the container).

Names (namespace, pod, container) are not in the cgroup path, only the pod UID and the
container id. They come from the kubelet's pod-resources API
(:mod:`stallscope.sources.podresources`), which lists each container's devices: a process is
matched to the container that holds the GPUs it was given, as dcgm-exporter matches GPUs to
pods.

Label names are dcgm-exporter's: ``namespace``, ``pod``, ``container``, and ``hpc_job`` for a
Slurm job (the label its HPC job mapping writes).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

__all__ = [
    "OWNER_KEYS",
    "Owner",
    "OwnerCache",
    "describe",
    "owner_from_env",
    "parse_cgroup",
    "read_environ",
    "read_owner",
]

#: the owner attributes a process or GPU carries, in label order (dcgm-exporter's names)
OWNER_KEYS = ("namespace", "pod", "container", "hpc_job")

#: a pod UID: dashed (``pod1e597579-417e-...``), with systemd's underscores
#: (``pod1e597579_417e_...``), or a static pod's 32-hex config hash
_POD = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
    r"|[0-9a-f]{32})(?![0-9a-f])"
)
#: a container id after the pod: ``cri-containerd-ID.scope``, ``crio-ID.scope``,
#: ``docker-ID.scope``, ``...slice:cri-containerd:ID`` or the bare id (cgroupfs driver)
_CONTAINER = re.compile(
    r"(?:(cri-containerd|crio|docker|containerd)[-:])?(?<![0-9a-f])"
    r"([0-9a-f]{64})(?:\.scope)?$"
)
#: Slurm: ``/slurm[_NODE]/uid_U/job_J/step_S/...`` (v1), ``/system.slice/[NODE_]slurmstepd.scope/
#: job_J/step_S/...`` (v2)
_SLURM = re.compile(
    r"/(?:slurm(?:_[^/]+)?/uid_\d+|system\.slice/(?:[^/]+_)?slurmstepd\.scope)"
    r"/job_([0-9]+)(?=/|$)(?:/step_([A-Za-z0-9_]+)(?=/|$))?"
)
#: a Kubernetes object name (RFC 1123: lower-case alphanumerics, '-' and '.', at most 253):
#: what a pod or namespace name from an environment or a file must be to be shown at all
_K8S_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


def k8s_name(v: str) -> str | None:
    """``v`` when it is a valid Kubernetes name, else None (an environment can hold anything:
    escape sequences, newlines)."""
    v = v.strip()
    return v if _K8S_NAME.fullmatch(v) else None


def slurm_job(v: str) -> str | None:
    """A Slurm job id: ASCII digits only (``isdigit`` also takes full-width and superscript
    digits)."""
    v = v.strip()
    return v if v.isascii() and v.isdigit() else None


_RUNTIMES = {
    "cri-containerd": "containerd",
    "containerd": "containerd",
    "crio": "cri-o",
    "docker": "docker",
}


@dataclass(frozen=True)
class Owner:
    """What a process belongs to; every field None when unknown."""

    namespace: str | None = None
    pod: str | None = None
    container: str | None = None
    pod_uid: str | None = None  #: from the cgroup path (dashed)
    container_id: str | None = None  #: from the cgroup path (64 hex)
    runtime: str | None = None  #: containerd, cri-o, docker (from the cgroup path)
    hpc_job: str | None = None  #: the Slurm job id
    step: str | None = None  #: the Slurm step (``0``, ``batch``, ``extern``)
    gpus: tuple[str, ...] = ()  #: GPU UUIDs the process was given (NVIDIA_VISIBLE_DEVICES)
    #: where the names came from: "kubelet" (pod-resources), "environment", or "" (cgroup only)
    names_from: str = ""

    @property
    def known(self) -> bool:
        return bool(self.pod_uid or self.pod or self.hpc_job)

    def attrs(self) -> dict[str, str]:
        """The owner labels that are known (:data:`OWNER_KEYS`), for a series or meta.json."""
        return {k: v for k in OWNER_KEYS if (v := getattr(self, k))}

    def record(self) -> dict[str, Any]:
        """Everything known, for meta.json (``owner``)."""
        out: dict[str, Any] = {
            k: getattr(self, k)
            for k in (*OWNER_KEYS, "pod_uid", "container_id", "runtime", "step")
            if getattr(self, k)
        }
        if self.gpus:
            out["gpus"] = list(self.gpus)
        if self.names_from:
            out["names_from"] = self.names_from
        return out

    def merge(self, other: Owner) -> Owner:
        """This owner with ``other``'s fields filled in where this one has none."""
        kw = {f: getattr(self, f) or getattr(other, f) for f in self.__dataclass_fields__}
        return Owner(**kw)


def describe(owner: Mapping[str, Any] | None) -> str:
    """``job 4242`` / ``pod team-a/trainer-0 (container pytorch)`` / ``pod 1e597579…``: the
    owner in words for a diagnosis line; "" when nothing is known."""
    from stallscope.textsafe import plain

    if not owner:
        return ""
    # the owner comes back from meta.json, a file like any other: escaped wherever it is shown
    if owner.get("hpc_job"):
        return f"job {plain(str(owner['hpc_job']), 40)}"
    if owner.get("pod"):
        ns = f"{plain(str(owner['namespace']), 80)}/" if owner.get("namespace") else ""
        ctr = f" (container {plain(str(owner['container']), 80)})" if owner.get("container") else ""
        return f"pod {ns}{plain(str(owner['pod']), 120)}{ctr}"
    if owner.get("pod_uid"):
        return f"pod {plain(str(owner['pod_uid'])[:8])}…"
    return ""


def parse_cgroup(text: str) -> Owner:
    """The owner ``/proc/PID/cgroup`` names (cgroup v1 lines ``N:controllers:/path``, v2
    ``0::/path``; kubelet's cgroupfs and systemd drivers with containerd, CRI-O or Docker;
    Slurm v1 and v2). Garbage or an unowned process gives an empty :class:`Owner`."""
    pod_uid = container_id = runtime = job = step = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        path = parts[2].strip()
        if not path.startswith("/"):
            continue
        if pod_uid is None:
            m = _POD.search(path)
            if m is not None:
                raw = m.group(1).replace("_", "-")
                pod_uid = raw
                tail = path[m.end() :]
                last = tail.rstrip("/").rsplit("/", 1)[-1] if "/" in tail else tail
                last = last.removeprefix(".slice").lstrip(":")
                c = _CONTAINER.search(last)
                if c is not None:
                    container_id = c.group(2)
                    runtime = _RUNTIMES.get(c.group(1) or "")
        if job is None:
            s = _SLURM.search(path)
            if s is not None:
                job, step = s.group(1), s.group(2)
    return Owner(
        pod_uid=pod_uid, container_id=container_id, runtime=runtime, hpc_job=job, step=step
    )


def _uuids(value: str) -> tuple[str, ...]:
    """GPU and MIG UUIDs in an NVIDIA_VISIBLE_DEVICES value (``all``, indices, ``none`` and
    the device plugin's volume-mount marker name none)."""
    return tuple(v.strip() for v in value.split(",") if v.strip().startswith(("GPU-", "MIG-")))


def owner_from_env(env: Mapping[str, str]) -> Owner:
    """The owner a process's environment names: the Slurm job (``SLURM_JOB_ID``, older
    ``SLURM_JOBID``; the step from ``SLURM_STEP_ID``), the pod and namespace where the
    Downward API put them in ``POD_NAME``/``POD_NAMESPACE``, and the GPUs the device plugin
    gave the container (``NVIDIA_VISIBLE_DEVICES``)."""
    job = slurm_job(env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or "")
    step = slurm_job(env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID") or "")
    pod = k8s_name(env.get("POD_NAME") or "")
    ns = k8s_name(env.get("POD_NAMESPACE") or "")
    return Owner(
        namespace=ns,
        pod=pod,
        hpc_job=job,
        step=step,
        gpus=_uuids(env.get("NVIDIA_VISIBLE_DEVICES") or ""),
        names_from="environment" if pod else "",
    )


def read_environ(proc: Path) -> dict[str, str] | None:
    """``/proc/PID/environ`` as a dict; None where it cannot be read (another user's process
    without ptrace rights, or gone)."""
    try:
        raw = proc.joinpath("environ").read_bytes()
    except OSError:
        return None
    return dict(kv.split("=", 1) for kv in raw.decode(errors="replace").split("\0") if "=" in kv)


def read_owner(pid: int, proc_root: str = "/proc", containers: Iterable[Any] = ()) -> Owner:
    """The owner of ``pid`` from its cgroup and (where readable) environment; ``containers``:
    the kubelet's containers with their devices
    (:meth:`stallscope.sources.podresources.PodResources.containers`), to name the pod whose
    GPUs the process was given."""
    proc = Path(proc_root) / str(pid)
    try:
        owner = parse_cgroup((proc / "cgroup").read_text(errors="replace"))
    except OSError:
        owner = Owner()
    env = read_environ(proc)  # another user's: the cgroup still says the pod or the job
    if env is not None:
        owner = owner.merge(owner_from_env(env))
    if owner.pod_uid and not owner.pod and env is not None:
        owner = _pod_from_inside(owner, proc, env)
    if owner.gpus:
        want = set(owner.gpus)
        for c in containers:
            if want & set(c.device_ids()):
                owner = replace(
                    owner,
                    namespace=c.namespace,
                    pod=c.pod,
                    container=c.container,
                    names_from="kubelet",
                )
                break
    return owner


#: where every pod finds its namespace (the service account's projected volume)
SA_NAMESPACE = "var/run/secrets/kubernetes.io/serviceaccount/namespace"


def _pod_from_inside(owner: Owner, proc: Path, env: Mapping[str, str]) -> Owner:
    """A pod's names as the pod itself sees them: kubelet sets a container's host name to its
    pod's name (unless the spec sets ``hostname``), and mounts the namespace at
    :data:`SA_NAMESPACE` (read through ``/proc/PID/root``, with the same rights as its
    environment; absent when the pod does not mount a service account token)."""
    pod = k8s_name(env.get("HOSTNAME") or "")
    try:
        ns = k8s_name((proc / "root" / SA_NAMESPACE).read_text(errors="replace")[:300]) or ""
    except OSError:
        ns = ""
    if not pod:
        return owner
    return replace(
        owner, pod=pod, namespace=owner.namespace or ns or None, names_from="environment"
    )


class OwnerCache:
    """Owners of processes, read once per process (a process cannot change pod or job; a pid
    reused by a new process has a new start time, so it is read again)."""

    def __init__(self, proc_root: str = "/proc", kubelet: Any = None) -> None:
        self.proc_root = proc_root
        #: a :class:`~stallscope.sources.podresources.PodResources` or None
        self.kubelet = kubelet
        self._owners: dict[tuple[int, int | None], Owner] = {}

    def _start(self, pid: int) -> int | None:
        from stallscope.sources.procs import parse_pid_stat

        try:
            return parse_pid_stat((Path(self.proc_root) / str(pid) / "stat").read_text()).starttime
        except (OSError, ValueError, IndexError):
            return None

    def owner(self, pid: int) -> Owner:
        key = (pid, self._start(pid))
        got = self._owners.get(key)
        if got is None:
            conts = self.kubelet.containers() if self.kubelet is not None else ()
            got = read_owner(pid, self.proc_root, conts)
            if len(self._owners) > 4096:
                self._owners.clear()
            self._owners[key] = got
        return got
