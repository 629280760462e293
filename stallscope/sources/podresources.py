"""The kubelet's pod-resources API (v1): which pod and container hold which devices.

The kubelet serves ``v1.PodResourcesLister`` over gRPC on a unix socket
(``/var/lib/kubelet/pod-resources/kubelet.sock``); its ``List`` call answers, per pod, the
name, namespace and each container's devices by resource (``nvidia.com/gpu`` ->
``GPU-<uuid>``; MIG resources -> ``MIG-<uuid>``). dcgm-exporter names the pods on its GPU series
this way, and so does stallscope: a GPU's series carry the pod holding it, and a process is
named after the container whose GPUs it was given (:mod:`stallscope.sources.owner`).

The messages are declared here from the published ``api.proto`` (field numbers as there; only
the fields stallscope reads: protobuf skips the others, so a newer kubelet's answer parses) and
built at run time with protobuf's descriptor pool: no generated code, no build step. grpcio and
protobuf come with the ``k8s`` extra (``pip install 'stallscope[k8s]'``).

Reading the socket needs the rights the kubelet gives it (root, or the DaemonSet's hostPath
mount); without them, or without a kubelet, :meth:`PodResources.containers` is empty and says
why once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT_SOCKET", "LIST_METHOD", "PodResources", "device_owners", "list_messages"]

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
LIST_METHOD = "/v1.PodResourcesLister/List"
#: the kubelet's own limit on a pod-resources answer
MAX_MESSAGE_BYTES = 16 * 1024 * 1024

#: (message, [(field, number, type, label, message type)]) of the v1 API, as published
_FIELDS: tuple[tuple[str, tuple[tuple[str, int, str, str, str], ...]], ...] = (
    ("ListPodResourcesRequest", ()),
    ("ListPodResourcesResponse", (("pod_resources", 1, "message", "repeated", "PodResources"),)),
    (
        "PodResources",
        (
            ("name", 1, "string", "optional", ""),
            ("namespace", 2, "string", "optional", ""),
            ("containers", 3, "message", "repeated", "ContainerResources"),
        ),
    ),
    (
        "ContainerResources",
        (
            ("name", 1, "string", "optional", ""),
            ("devices", 2, "message", "repeated", "ContainerDevices"),
        ),
    ),
    (
        "ContainerDevices",
        (
            ("resource_name", 1, "string", "optional", ""),
            ("device_ids", 2, "string", "repeated", ""),
        ),
    ),
)

_messages: dict[str, Any] | None = None
_lock = threading.Lock()


def list_messages() -> dict[str, Any]:
    """The v1 message classes by name (``ListPodResourcesRequest``, ...), built once."""
    global _messages
    with _lock:
        if _messages is None:
            _messages = _build()
        return _messages


def _build() -> dict[str, Any]:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    fdp = descriptor_pb2.FileDescriptorProto(
        name="stallscope/podresources/v1/api.proto", package="v1", syntax="proto3"
    )
    F = descriptor_pb2.FieldDescriptorProto
    kinds = {"string": F.TYPE_STRING, "message": F.TYPE_MESSAGE}
    labels = {"optional": F.LABEL_OPTIONAL, "repeated": F.LABEL_REPEATED}
    for name, fields in _FIELDS:
        msg = fdp.message_type.add(name=name)
        for fname, number, kind, label, type_name in fields:
            f = msg.field.add(name=fname, number=number, type=kinds[kind], label=labels[label])
            if type_name:
                f.type_name = f".v1.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    out = {}
    for name, _f in _FIELDS:
        desc = pool.FindMessageTypeByName(f"v1.{name}")
        get = getattr(message_factory, "GetMessageClass", None)
        out[name] = get(desc) if get else message_factory.MessageFactory(pool).GetPrototype(desc)
    return out


@dataclass(frozen=True)
class ContainerDevices:
    """One container and the devices the kubelet gave it."""

    namespace: str
    pod: str
    container: str
    devices: tuple[tuple[str, str], ...]  #: (resource name, device id)

    def names(self) -> dict[str, str]:
        return {"namespace": self.namespace, "pod": self.pod, "container": self.container}

    def device_ids(self) -> tuple[str, ...]:
        return tuple(d for _r, d in self.devices)


def parse_list(response: Any) -> list[ContainerDevices]:
    """Every container of a ``ListPodResourcesResponse`` with its devices."""
    out = []
    for pod in response.pod_resources:
        for c in pod.containers:
            devices = tuple((d.resource_name, i) for d in c.devices for i in d.device_ids)
            out.append(ContainerDevices(pod.namespace, pod.name, c.name, devices))
    return out


def device_owners(containers: list[ContainerDevices]) -> dict[str, dict[str, str]]:
    """Device id (a GPU or MIG UUID) -> the namespace, pod and container holding it."""
    return {dev: c.names() for c in containers for dev in c.device_ids()}


class PodResources:
    """A client of one kubelet's pod-resources socket; the answer is kept ``refresh_s``."""

    def __init__(
        self, socket_path: str = DEFAULT_SOCKET, refresh_s: float = 10.0, timeout_s: float = 2.0
    ) -> None:
        self.socket_path = socket_path
        self.refresh_s = refresh_s
        self.timeout_s = timeout_s
        self.problem: str | None = None  #: why the last call gave nothing, in one line
        self._at = -1e18
        self._last: list[ContainerDevices] = []
        self._channel: Any = None
        self._call: Any = None

    def _list(self) -> list[ContainerDevices]:
        import grpc

        msgs = list_messages()
        if self._call is None:
            self._channel = grpc.insecure_channel(
                f"unix://{self.socket_path}",
                options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)],
            )
            self._call = self._channel.unary_unary(
                LIST_METHOD,
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=msgs["ListPodResourcesResponse"].FromString,
            )
        return parse_list(self._call(msgs["ListPodResourcesRequest"](), timeout=self.timeout_s))

    def containers(self) -> list[ContainerDevices]:
        """The kubelet's containers and their devices (as of at most ``refresh_s`` ago); []
        with :attr:`problem` set when it cannot be asked."""
        now = time.monotonic()
        if now - self._at < self.refresh_s:
            return self._last
        self._at = now
        try:
            self._last = self._list()
            self.problem = None
        except ImportError:
            self._last = []
            self.problem = "pod names need grpcio and protobuf: pip install 'stallscope[k8s]'"
        except Exception as exc:  # grpc.RpcError and anything a broken answer raises
            self._last = []
            self.problem = f"the kubelet's pod-resources API at {self.socket_path}: " + _reason(exc)
        return self._last

    def device_owners(self) -> dict[str, dict[str, str]]:
        return device_owners(self.containers())

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = self._call = None


def _reason(exc: BaseException) -> str:
    details = getattr(exc, "details", None)
    code = getattr(exc, "code", None)
    if callable(details) and callable(code):
        try:
            return f"{code().name.lower()}: {str(details())[:200]}"
        except Exception:  # a malformed status
            pass
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__


def containers_of(doc: Mapping[str, Any]) -> list[ContainerDevices]:
    """Containers from a JSON-shaped answer (``{"pod_resources": [{"name", "namespace",
    "containers": [{"name", "devices": [{"resource_name", "device_ids"}]}]}]}``): the same
    shape the API has, for tests and recorded answers."""
    msgs = list_messages()
    from google.protobuf import json_format

    resp = msgs["ListPodResourcesResponse"]()
    json_format.ParseDict(dict(doc), resp, ignore_unknown_fields=True)
    return parse_list(resp)
