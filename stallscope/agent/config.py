"""The agent's configuration: a flat TOML file, every key optional, flags override it.

::

    listen = "127.0.0.1:10127"    # host:port ([::1]:10127 for IPv6); loopback unless told
    interval_s = 5.0             # seconds between samples (0.1 - 3600)
    store_dir = "/var/lib/stallscope/agent"   # default: $STALLSCOPE_STATE_DIR/agent
    keep_full_s = 3600           # full resolution for this long, then 1-minute buckets
    gpus = [0, 1]                # NVML indices to include (default: all)
    devices = ["nvme0n1"]        # block devices to include (default: whole devices with I/O)
    run_indexes = ["/home/*/.local/state/stallscope/runs.txt"]  # more run indexes to follow
    smart = ["sda", "nvme0n1"]   # drives whose SMART is checked every 10 min (default: none)
    host_label = "Hostname"      # the host label's spelling: as the fleet's dcgm-exporter
                                 # ("Hostname" up to 4.5.3-4.8.2, "hostname" after)
    kubelet_socket = "/var/lib/kubelet/pod-resources/kubelet.sock"  # pod names ("" = off;
                                 # default: that path when it exists)
    hostname = "gpu-node-7"      # the host label's value (default: this machine's name)
    worker_series = "process"    # "rank": one series per rank for its DataLoader workers

    [[alerts]]                   # alert rules, as in `stallscope run --alerts FILE`
    name = "gpu_hot"             # (docs/alerts.md); the shipped defaults are always on
    metric = "gpu.temp_c"
    above = 83
    actions = [{webhook = "http://127.0.0.1:9000/hook"}]

    [smtp]                       # for email actions
    host = "127.0.0.1"

An unknown key or a bad value is one line naming the key (:class:`ConfigError`, exit 2).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from stallscope.alerts.rulefile import RulesFile, parse_rules
from stallscope.errors import StallscopeError
from stallscope.labels import HOST_LABEL, HOST_LABELS
from stallscope.store.paths import state_dir
from stallscope.tomlfile import TomlFileError, read_toml

__all__ = [
    "DEFAULT_LISTEN",
    "WORKER_SERIES",
    "AgentConfig",
    "ConfigError",
    "default_store_dir",
    "load_config",
    "parse_listen",
]

DEFAULT_LISTEN = "127.0.0.1:10127"
DEFAULT_INTERVAL_S = 5.0
DEFAULT_KEEP_FULL_S = 3600.0
#: how DataLoader workers are exported: one series each, or summed per rank
WORKER_SERIES = ("process", "rank")


class ConfigError(StallscopeError):
    """A config file that cannot be used: the message names the file and the key."""

    exit_code = 2


@dataclass
class AgentConfig:
    listen: str = DEFAULT_LISTEN
    interval_s: float = DEFAULT_INTERVAL_S
    store_dir: str | None = None  #: None: :func:`default_store_dir`
    keep_full_s: float = DEFAULT_KEEP_FULL_S
    gpus: list[int] | None = None  #: NVML indices to include; None: all
    devices: list[str] | None = None  #: block devices to include; None: the disk default
    #: run index files (glob patterns) whose running trainings the agent exports, beside the
    #: index of the user it runs as
    run_indexes: list[str] = field(default_factory=list)
    smart: list[str] | None = None  #: drives whose SMART the agent checks; None: none
    #: how the host label is spelled (:data:`stallscope.labels.HOST_LABELS`)
    host_label: str = HOST_LABEL
    #: the kubelet's pod-resources socket (pod names); None: the default path when it exists;
    #: "": never ask
    kubelet_socket: str | None = None
    #: the host label's value; None: the machine's host name (a pod's is its own name, so a
    #: DaemonSet gives the node's)
    hostname: str | None = None
    #: "process": a series per DataLoader worker; "rank": the workers of each rank summed into
    #: one series (:data:`WORKER_SERIES`)
    worker_series: str = "process"
    alerts: list[dict[str, Any]] = field(default_factory=list)  #: ``[[alerts]]`` tables
    smtp: dict[str, Any] | None = None  #: the ``[smtp]`` table of email actions
    path: str | None = field(default=None, compare=False)  #: the file it came from

    def rules(self) -> RulesFile:
        """The alert rules: the shipped defaults with this file's ``[[alerts]]`` over them."""
        doc: dict[str, Any] = {"alerts": self.alerts}
        if self.smtp is not None:
            doc["smtp"] = self.smtp
        return parse_rules(doc, self.path or "agent config")

    def store_path(self) -> Path:
        return Path(self.store_dir) if self.store_dir else default_store_dir()


KNOWN_KEYS: tuple[str, ...] = tuple(f.name for f in fields(AgentConfig) if f.name != "path")

_HOSTPORT = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[^:\[\]\s]*)):(?P<port>\d{1,5})$")
#: a name as /proc/diskstats prints it (``nvme0n1``, ``dm-0``, ``cciss/c0d0``)
_DEVICE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.!:/-]*$")


def default_store_dir(env: dict[str, str] | None = None) -> Path:
    """``$STALLSCOPE_STATE_DIR/agent``, else ``$XDG_STATE_HOME/stallscope/agent``, else
    ``~/.local/state/stallscope/agent`` (beside the run index and the SMART history)."""
    return state_dir(env) / "agent"


def parse_listen(text: str) -> tuple[str, int]:
    """``host:port`` (``[::1]:10127`` for IPv6) -> (host, port); ValueError with the reason."""
    m = _HOSTPORT.match(text.strip())
    if m is None:
        raise ValueError(f"must be HOST:PORT (e.g. {DEFAULT_LISTEN}), got {text!r}")
    host = m.group("v6") or m.group("host") or ""
    port = int(m.group("port"))
    if not 0 <= port <= 65535:
        raise ValueError(f"port must be 0-65535, got {port}")
    if not host:
        raise ValueError(
            f"must name the address to bind (0.0.0.0 for every interface), got {text!r}"
        )
    return host, port


def _seconds(key: str, v: Any, lo: float, hi: float) -> float:
    if (
        isinstance(v, bool)
        or not isinstance(v, (int, float))
        or not math.isfinite(v)
        or not lo <= v <= hi
    ):
        raise ValueError(f"{key} must be a number of seconds between {lo:g} and {hi:g}, got {v!r}")
    return float(v)


def _check(key: str, v: Any) -> Any:
    """The value of ``key`` as the agent uses it; ValueError naming the key if it is bad."""
    if key == "listen":
        if not isinstance(v, str):
            raise ValueError(f"listen must be a string HOST:PORT, got {v!r}")
        try:
            parse_listen(v)
        except ValueError as exc:
            raise ValueError(f"listen {exc}") from None
        return v
    if key == "interval_s":
        return _seconds(key, v, 0.1, 3600)
    if key == "keep_full_s":
        return _seconds(key, v, 60, 10 * 365 * 86400)
    if key == "store_dir":
        if not isinstance(v, str) or not v.strip():
            raise ValueError(f"store_dir must be a directory path, got {v!r}")
        return os.path.expanduser(v)
    if key == "gpus":
        if not isinstance(v, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in v
        ):
            raise ValueError(f"gpus must be a list of GPU indices such as [0, 1], got {v!r}")
        return sorted(set(v))
    if key == "alerts":
        if not isinstance(v, list):
            raise ValueError("alerts must be [[alerts]] tables (docs/alerts.md)")
        return v
    if key == "smtp":
        if not isinstance(v, dict):
            raise ValueError("smtp must be a [smtp] table (docs/alerts.md)")
        return v
    if key in ("devices", "smart"):
        names = [
            d.removeprefix("/dev/") if isinstance(d, str) else d
            for d in (v if isinstance(v, list) else [None])
        ]
        if not all(isinstance(d, str) and _DEVICE.match(d) and ".." not in d for d in names):
            raise ValueError(
                f'{key} must be a list of block device names such as ["nvme0n1"], got {v!r}'
            )
        return names
    if key == "host_label":
        if v not in HOST_LABELS:
            raise ValueError(
                f"host_label must be one of {', '.join(map(repr, HOST_LABELS))} "
                f"(as the fleet's dcgm-exporter spells it), got {v!r}"
            )
        return v
    if key == "worker_series":
        if v not in WORKER_SERIES:
            raise ValueError(
                f'worker_series must be "process" (a series per DataLoader '
                f'worker) or "rank" (a rank\'s workers summed), got {v!r}'
            )
        return v
    if key == "hostname":
        if not isinstance(v, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}", v):
            raise ValueError(
                f"hostname must be a host name (letters, digits, '.', '-', '_'), got {v!r}"
            )
        return v
    if key == "kubelet_socket":
        if not isinstance(v, str) or "\n" in v or "\0" in v:
            raise ValueError(
                f'kubelet_socket must be a socket path ("" to never ask the kubelet), got {v!r}'
            )
        return os.path.expanduser(v)
    if key == "run_indexes":
        if not isinstance(v, list) or not all(isinstance(p, str) and p.strip() for p in v):
            raise ValueError(
                f"run_indexes must be a list of run index paths (glob patterns "
                f'allowed) such as ["/srv/stallscope/runs.txt"], got {v!r}'
            )
        return [os.path.expanduser(p) for p in v]
    raise KeyError(key)


def load_config(path: str | os.PathLike[str]) -> AgentConfig:
    """Read a config file; :class:`ConfigError` (one line naming the file and the key) for an
    unreadable file, bad TOML, an unknown key or a bad value."""
    where = f"config {path}"
    try:
        doc = read_toml(path)
    except TomlFileError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    cfg = AgentConfig(path=str(path))
    for key, value in doc.items():
        if key not in KNOWN_KEYS:
            raise ConfigError(f"{where}: unknown key {key!r} (known: {', '.join(KNOWN_KEYS)})")
        try:
            setattr(cfg, key, _check(key, value))
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    problems = cfg.rules().problems
    if problems:  # one line per problem, each naming the key, as `stallscope alerts check`
        raise ConfigError("\nstallscope: ".join(f"{where}: {p}" for p in problems))
    return cfg


def check_value(key: str, value: Any) -> Any:
    """A flag's value checked as the config key of the same meaning (ValueError if bad)."""
    return _check(key, value)
