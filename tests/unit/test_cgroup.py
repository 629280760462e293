"""The cgroup readers (stallscope.sources.cgroup) on fake /proc, /sys and cgroup trees built in
``tmp_path``: the CPU quota and the read limits a process's cgroups set, v1 and v2."""

from __future__ import annotations

import os
from pathlib import Path

from stallscope.sources.cgroup import (
    cgroup_cpus,
    parse_read_caps,
    read_caps,
    read_limits,
    usable_cores,
)

#: a Slurm step's task cgroup on a cgroup v2 node (slurmstepd with cgroup/v2, no cgroup
#: namespace): the path /proc/PID/cgroup names, below the mount's root
SLURM_V2_TASK = "system.slice/slurmstepd.scope/job_123/step_0/user/task_0"
#: the same task under Slurm's cgroup/v1 plugin (cpu,cpuacct mounted together)
SLURM_V1_STEP = "slurm/uid_1000/job_123/step_0/task_0"


def slurm_v2_tree(tmp_path: Path, pid: int = 4242) -> tuple[Path, Path]:
    """A recorded Slurm v2 hierarchy: every level has its ``cpu.max`` (``max`` where Slurm sets
    none), the job's allows 4 CPUs, ``system.slice`` a looser 16; ``/proc/PID/cgroup`` puts the
    process in the task's cgroup. Returns (proc root, cgroup mount)."""
    proc, cg = tmp_path / "proc", tmp_path / "sys" / "fs" / "cgroup"
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "cgroup").write_text(f"0::/{SLURM_V2_TASK}\n")
    (cg / SLURM_V2_TASK).mkdir(parents=True)
    (cg / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma misc\n")
    levels = SLURM_V2_TASK.split("/")
    for depth in range(1, len(levels) + 1):
        folder = cg.joinpath(*levels[:depth])
        (folder / "cpu.max").write_text("max 100000\n")
        (folder / "cgroup.procs").write_text("")
    (cg / "system.slice" / "cpu.max").write_text("1600000 100000\n")
    (cg / "system.slice" / "slurmstepd.scope" / "job_123" / "cpu.max").write_text("400000 100000\n")
    (cg / SLURM_V2_TASK / "cgroup.procs").write_text(f"{pid}\n")
    return proc, cg


def test_the_cpu_quota_of_a_slurm_job_is_found_below_the_mounts_root(tmp_path: Path) -> None:
    """No cgroup namespace: the mount's root has no quota, the job's cgroup three levels above
    the task has 4 CPUs; the tightest limit up the tree wins."""
    proc, cg = slurm_v2_tree(tmp_path)
    assert not (cg / "cpu.max").exists()
    assert cgroup_cpus(str(cg), 4242, proc_root=str(proc)) == 4
    assert usable_cores(str(cg), 4242, proc_root=str(proc)) <= 4
    # a tighter limit lower down (the step) wins over the job's
    (cg / "system.slice" / "slurmstepd.scope" / "job_123" / "step_0" / "cpu.max").write_text(
        "250000 100000\n"
    )
    assert cgroup_cpus(str(cg), 4242, proc_root=str(proc)) == 2
    # the slice's limit alone still binds the task
    for folder in ("job_123", "job_123/step_0"):
        (cg / "system.slice" / "slurmstepd.scope" / folder / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpus(str(cg), 4242, proc_root=str(proc)) == 16
    # another process, in no cgroup below the root, has no quota
    (proc / "99").mkdir()
    (proc / "99" / "cgroup").write_text("0::/\n")
    assert cgroup_cpus(str(cg), 99, proc_root=str(proc)) is None
    # a path climbing out of the mount reads nothing above it
    (tmp_path / "sys" / "fs" / "cpu.max").write_text("100000 100000\n")
    (proc / "99" / "cgroup").write_text("0::/../\n")
    assert cgroup_cpus(str(cg), 99, proc_root=str(proc)) is None


def test_the_cpu_quota_of_a_slurm_v1_job_is_found_in_the_cpu_controller(tmp_path: Path) -> None:
    proc, cg = tmp_path / "proc", tmp_path / "cg"
    (proc / "7").mkdir(parents=True)
    (proc / "7" / "cgroup").write_text(f"5:cpu,cpuacct:/{SLURM_V1_STEP}\n4:memory:/x\n0::/\n")
    job = cg / "cpu,cpuacct" / "slurm" / "uid_1000" / "job_123"
    (job / "step_0" / "task_0").mkdir(parents=True)
    for folder in (job, job / "step_0", job / "step_0" / "task_0"):
        (folder / "cpu.cfs_quota_us").write_text("-1\n")
        (folder / "cpu.cfs_period_us").write_text("100000\n")
    (job / "cpu.cfs_quota_us").write_text("300000\n")
    assert cgroup_cpus(str(cg), 7, proc_root=str(proc)) == 3


def test_read_limits_names_devices_from_the_given_sys_root(tmp_path: Path) -> None:
    """The device's name comes from ``sys_root``'s /dev/block links, not the machine's /sys."""
    proc, cg, sys_root = tmp_path / "proc", tmp_path / "cg", tmp_path / "sys"
    (proc / "42").mkdir(parents=True)
    (proc / "42" / "cgroup").write_text(f"0::/{SLURM_V2_TASK}\n")
    (cg / SLURM_V2_TASK).mkdir(parents=True)
    (cg / "system.slice" / "io.max").write_text("4000:7 rbps=5000000 wbps=max\n")
    (sys_root / "dev" / "block").mkdir(parents=True)
    os.symlink("../../devices/virtual/block/fakedisk0", sys_root / "dev" / "block" / "4000:7")
    assert read_limits(42, proc_root=str(proc), cg_root=str(cg), sys_root=str(sys_root)) == {
        "fakedisk0": 5000000
    }
    assert (
        read_limits(42, proc_root=str(proc), cg_root=str(cg), sys_root=str(tmp_path / "nosys"))
        == {}
    )


def test_parse_read_caps_v1_and_v2() -> None:
    assert parse_read_caps("8:0 4000000\n254:0 10485760\n") == {"8:0": 4000000, "254:0": 10485760}
    v2 = "8:0 rbps=2097152 wbps=max riops=max wiops=max\n8:16 wbps=1000 riops=50\n"
    assert parse_read_caps(v2) == {"8:0": 2097152}  # 8:16 limits writes and IOPS only
    assert (
        parse_read_caps(
            "garbage\n\n8:0\n8:0 max\n8:0 rbps=max\nx 5\n8:1 -3\n8:2 \u00b2\n8:3 rbps=\u0661\n"
        )
        == {}
    )


def test_read_caps_takes_the_smallest_limit_up_the_cgroup_tree(tmp_path: Path) -> None:
    proc, cg = tmp_path / "proc", tmp_path / "cg"
    (proc / "42").mkdir(parents=True)
    (proc / "42" / "cgroup").write_text("7:blkio:/kubepods/pod1\n4:memory:/x\n0::/slice/job\n")
    (cg / "blkio" / "kubepods" / "pod1").mkdir(parents=True)
    (cg / "blkio" / "kubepods" / "blkio.throttle.read_bps_device").write_text("8:0 3000000\n")
    (cg / "blkio" / "kubepods" / "pod1" / "blkio.throttle.read_bps_device").write_text(
        "8:0 5000000\n8:16 7000000\n"
    )
    (cg / "slice" / "job").mkdir(parents=True)
    (cg / "slice" / "job" / "io.max").write_text("259:0 rbps=9000000 wbps=max\n")
    assert read_caps(42, proc_root=str(proc), cg_root=str(cg)) == {
        "8:0": 3000000,
        "8:16": 7000000,
        "259:0": 9000000,
    }
    assert read_caps(43, proc_root=str(proc), cg_root=str(cg)) == {}  # no such process
    (proc / "42" / "cgroup").write_text("7:blkio:/../../etc\n")  # never above the root
    assert read_caps(42, proc_root=str(proc), cg_root=str(cg)) == {}


def test_cgroup_cpu_quota_is_read_under_the_given_root(tmp_path: Path) -> None:
    """The quota reader hard-coded /sys/fs/cgroup; like every other reader it takes its root
    (and /proc's: here one without this process, so only the mount's root is read)."""
    proc = str(tmp_path / "proc")
    v2 = tmp_path / "v2"
    v2.mkdir()
    assert cgroup_cpus(str(v2), proc_root=proc) is None  # nothing there
    (v2 / "cpu.max").write_text("250000 100000\n")
    assert cgroup_cpus(str(v2), proc_root=proc) == 2
    assert usable_cores(str(v2), proc_root=proc) <= 2
    (v2 / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpus(str(v2), proc_root=proc) is None
    (v2 / "cpu.max").write_text("garbage\n")
    assert cgroup_cpus(str(v2), proc_root=proc) is None
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("300000\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpus(str(v1), proc_root=proc) == 3
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_cpus(str(v1), proc_root=proc) is None
    assert usable_cores(str(tmp_path / "none"), proc_root=proc) >= 1
