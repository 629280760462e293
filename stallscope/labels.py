"""The Prometheus label map, both directions, declared once beside :mod:`stallscope.metrics`.

A point of the vocabulary is ``(metric, entity, value)``; the entity's source also hands out
its attributes (a GPU's UUID and model, a process's role and parent). On the way out (the
agent's ``/metrics``, :mod:`stallscope.agent.exporter`) :func:`labels_for` turns entity and
attributes into labels; on the way back (``diagnose --prometheus``,
:mod:`stallscope.analysis.promdata`) :func:`entity_of` and :func:`attrs_of` turn labels into
the entity and attributes again. Both read the same :class:`EntityLabels` row, chosen by the
metric's :attr:`~stallscope.metrics.Metric.label`, so they cannot drift apart; a round-trip test
over every exported metric holds them to it.

The rows:

* ``gpu``: dcgm-exporter's labels, so dashboards join the two: ``gpu`` (the NVML index; the
  entity is ``gpu<N>``), ``UUID``, ``pci_bus_id``, ``device`` (``nvidia<N>``), ``modelName``,
  and the host label (:data:`HOST_LABEL`);
* ``pid``: a process of a followed training: ``pid``, ``role``, ``name`` (comm), ``run``,
  ``rank``, ``ppid``, its owner (``namespace``, ``pod``, ``container`` or ``hpc_job``, where
  known) and the host label; a GPU carries the owner labels of the pod holding it;
* ``gpu_pid``: one process on one GPU (entity ``gpu<N>:<pid>``): the GPU's labels, ``pid``
  and the process's owner;
* ``gpu_mig``: one MIG GPU instance (entity ``gpu<N>/gi<ID>``): the GPU's labels,
  ``GPU_I_ID`` and ``GPU_I_PROFILE`` as dcgm-exporter spells them;
* ``gpu_xid``: one XID code of one GPU (entity ``gpu<N>/xid<code>``): the GPU's labels and
  ``xid``;
* ``device``: a disk or drive as node_exporter names it (``nvme0n1``);
* ``cpu``: one core (``"3"``; the entity is ``cpu3``); ``mode``: a CPU mode of
  ``host_cpu_seconds_total``; ``rank``: a training rank (``rank<N>``; not exported).

A metric whose ``label`` is ``""`` is about the whole host and has no entity label.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stallscope.metrics import Metric

__all__ = [
    "ENTITY_LABELS",
    "HOST_LABEL",
    "HOST_LABELS",
    "EntityLabels",
    "attrs_of",
    "entity_of",
    "host_of",
    "labels_for",
    "row_labels",
]

#: the label naming the host on GPU, process and step series, spelled as dcgm-exporter spells
#: it so the two join: ``Hostname`` in every release up to 4.5.3-4.8.2; its main branch spells
#: it ``hostname`` since May 2026 (its #655). The agent's ``host_label`` setting follows the
#: dcgm-exporter a fleet runs; readers accept both.
HOST_LABEL = "Hostname"
HOST_LABELS = ("Hostname", "hostname")


@dataclass(frozen=True)
class EntityLabels:
    """How one kind of entity is spelled in labels."""

    label: str  #: the label whose value is the entity (less ``prefix``)
    prefix: str = ""  #: the entity is ``prefix + value`` (``gpu`` + ``"0"``)
    #: (attribute key, label name), in exposition order, for attributes the source gives
    attrs: tuple[tuple[str, str], ...] = ()
    #: (label name, format of the value, ``{}`` = the label's value) computed from the entity
    #: alone: dcgm-exporter's ``device="nvidia0"``
    derived: tuple[tuple[str, str], ...] = ()
    hostname: bool = False  #: the series also carries the host label (:data:`HOST_LABEL`)
    #: a second label after ``sep`` in the entity: ``gpu0:4242`` is ``gpu="0"``,
    #: ``pid="4242"``; ``gpu0/gi2`` is ``gpu="0"``, ``GPU_I_ID="2"``
    second: str = ""
    sep: str = ":"


#: whose job a process or GPU is (:mod:`stallscope.sources.owner`), named as dcgm-exporter
#: names its pod labels and its HPC job label
_OWNER = (
    ("namespace", "namespace"),
    ("pod", "pod"),
    ("container", "container"),
    ("hpc_job", "hpc_job"),
)

ENTITY_LABELS: dict[str, EntityLabels] = {
    "gpu": EntityLabels(
        "gpu",
        prefix="gpu",
        attrs=(("uuid", "UUID"), ("pci_bus_id", "pci_bus_id"), ("name", "modelName"), *_OWNER),
        derived=(("device", "nvidia{}"),),
        hostname=True,
    ),
    "pid": EntityLabels(
        "pid",
        attrs=(
            ("role", "role"),
            ("name", "name"),
            ("run", "run"),
            ("rank", "rank"),
            ("ppid", "ppid"),
            *_OWNER,
        ),
        hostname=True,
    ),
    # one process on one GPU: the GPU's labels, its pid, and the process's owner
    "gpu_pid": EntityLabels(
        "gpu",
        prefix="gpu",
        attrs=(("uuid", "UUID"), ("pci_bus_id", "pci_bus_id"), ("name", "modelName"), *_OWNER),
        derived=(("device", "nvidia{}"),),
        hostname=True,
        second="pid",
    ),
    # one MIG GPU instance (entity ``gpu<N>/gi<ID>``): dcgm-exporter's GPU_I_ID, GPU_I_PROFILE
    "gpu_mig": EntityLabels(
        "gpu",
        prefix="gpu",
        attrs=(
            ("uuid", "UUID"),
            ("pci_bus_id", "pci_bus_id"),
            ("name", "modelName"),
            ("mig_profile", "GPU_I_PROFILE"),
        ),
        derived=(("device", "nvidia{}"),),
        hostname=True,
        second="GPU_I_ID",
        sep="/gi",
    ),
    # XIDs of one GPU per code (entity ``gpu<N>/xid<code>``): the GPU's labels and ``xid``
    "gpu_xid": EntityLabels(
        "gpu",
        prefix="gpu",
        attrs=(("uuid", "UUID"), ("pci_bus_id", "pci_bus_id"), ("name", "modelName"), *_OWNER),
        derived=(("device", "nvidia{}"),),
        hostname=True,
        second="xid",
        sep="/xid",
    ),
    "device": EntityLabels("device"),
    "cpu": EntityLabels("cpu", prefix="cpu"),
    "mode": EntityLabels("mode"),
    "rank": EntityLabels("rank", prefix="rank"),
}


def _row(m: Metric) -> EntityLabels | None:
    return ENTITY_LABELS.get(m.label) if m.label else None


def _given(v: Any) -> bool:
    return v is not None and v != ""


def labels_for(
    m: Metric, entity: str, attrs: Mapping[str, Any], hostname: str, host_label: str = HOST_LABEL
) -> dict[str, str]:
    """The Prometheus labels of one point of metric ``m`` about ``entity`` (whose attributes
    the source gave in its reading's entities)."""
    row = _row(m)
    if row is None:
        return {"entity": entity} if entity else {}
    return row_labels(row, entity, attrs, hostname, host_label)


def row_labels(
    row: EntityLabels,
    entity: str,
    attrs: Mapping[str, Any],
    hostname: str,
    host_label: str = HOST_LABEL,
) -> dict[str, str]:
    """The labels of ``entity`` spelled as ``row`` says (:func:`labels_for` of any metric with
    that row)."""
    if not entity:
        return {host_label: hostname} if row.hostname else {}
    value = entity[len(row.prefix) :] if row.prefix and entity.startswith(row.prefix) else entity
    sub = ""
    if row.second:
        value, _, sub = value.partition(row.sep)
    out = {row.label: value}
    if row.second:
        out[row.second] = sub
    out.update((name, fmt.format(value)) for name, fmt in row.derived)
    out.update((label, str(attrs[key])) for key, label in row.attrs if _given(attrs.get(key)))
    if row.hostname:
        out[host_label] = hostname
    return out


def host_of(labels: Mapping[str, str]) -> str:
    """The host a series names, in either spelling of :data:`HOST_LABELS` ("" if none)."""
    return next((labels[k] for k in HOST_LABELS if labels.get(k)), "")


def entity_of(m: Metric, labels: Mapping[str, str]) -> str:
    """The store's entity of a series of metric ``m`` with these labels (the inverse of
    :func:`labels_for`)."""
    row = _row(m)
    if row is None:
        return labels.get("entity", "")
    value = labels.get(row.label)
    if value is None:
        return ""
    if row.second:
        return f"{row.prefix}{value}{row.sep}{labels.get(row.second, '')}"
    return row.prefix + value


def attrs_of(m: Metric, labels: Mapping[str, str]) -> dict[str, Any]:
    """The entity attributes a series' labels carry (the inverse of :func:`labels_for`)."""
    row = _row(m)
    if row is None:
        return {}
    return {key: labels[label] for key, label in row.attrs if label in labels}
