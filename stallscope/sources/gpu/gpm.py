"""GPM (GPU Performance Monitoring, Hopper+): SM activity and occupancy, tensor-core activity
and PCIe traffic over the interval between two samples of the GPU's counters, as DCGM's
profiling fields give them. Two sample buffers per GPU, kept on its :class:`GpuState`."""

from __future__ import annotations

from collections.abc import Callable

from stallscope.sources.gpu.nvml import GpuLost, Nvml
from stallscope.sources.gpu.reading import GpuState

__all__ = ["GPM_MIN_INTERVAL_S", "GPM_PCIE", "free_gpm", "read_gpm", "start_gpm"]

# GPM metrics (Hopper+), the DCGM profiling fields they match, and where they go
GPM_METRICS = (
    ("sm_active_pct", "NVML_GPM_METRIC_SM_UTIL"),  # DCGM PROF_SM_ACTIVE
    ("sm_occupancy_pct", "NVML_GPM_METRIC_SM_OCCUPANCY"),  # DCGM PROF_SM_OCCUPANCY
    ("tensor_active_pct", "NVML_GPM_METRIC_ANY_TENSOR_UTIL"),  # DCGM PROF_PIPE_TENSOR_ACTIVE
)
#: GPM's PCIe traffic (MiB/s), read with the metrics above: NVML's non-blocking PCIe rate
GPM_PCIE = (
    ("pcie_tx_mib_s", "NVML_GPM_METRIC_PCIE_TX_PER_SEC"),
    ("pcie_rx_mib_s", "NVML_GPM_METRIC_PCIE_RX_PER_SEC"),
)
#: NVML computes GPM metrics from samples at least this far apart (its refresh rate).
GPM_MIN_INTERVAL_S = 0.1


def start_gpm(nvml: Nvml, gpu: GpuState, clock: Callable[[], float]) -> None:
    """Allocate two sample buffers and take the first sample, if the GPU supports GPM."""
    call = nvml.call
    try:
        support = call("nvmlGpmQueryDeviceSupport", gpu.handle)
        if support is None or not int(getattr(support, "isSupportedDevice", 0)):
            return
        samples = [call("nvmlGpmSampleAlloc"), call("nvmlGpmSampleAlloc")]
        gpu.gpm_samples = [s for s in samples if s is not None]
        if len(gpu.gpm_samples) < 2:
            free_gpm(nvml, gpu)
            return
        if call("nvmlGpmSampleGet", gpu.handle, gpu.gpm_samples[0]) is None:
            free_gpm(nvml, gpu)
            return
        gpu.gpm_taken_at = clock()
    except GpuLost:
        free_gpm(nvml, gpu)  # the next regular read reports the loss


def read_gpm(nvml: Nvml, gpu: GpuState, clock: Callable[[], float]) -> dict[str, float | None]:
    """GPM metrics over the interval since the previous sample of this GPU, then keep the
    new sample as the next previous one. Empty where GPM is off or unsupported."""
    if len(gpu.gpm_samples) < 2 or gpu.gpm_taken_at is None:
        return {}
    now = clock()
    if now - gpu.gpm_taken_at < GPM_MIN_INTERVAL_S:
        return {}  # too soon for NVML to have new counters; keep the older sample
    b, call = nvml.backend, nvml.call
    previous, spare = gpu.gpm_samples
    if call("nvmlGpmSampleGet", gpu.handle, spare) is None:
        free_gpm(nvml, gpu)
        return {}
    gpu.gpm_samples = [spare, previous]
    gpu.gpm_taken_at = now
    metrics = GPM_METRICS + (GPM_PCIE if gpu.pcie_gpm is not False else ())
    request = b.c_nvmlGpmMetricsGet_t()
    request.version = b.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(metrics)
    request.sample1 = previous
    request.sample2 = spare
    for i, (_, metric) in enumerate(metrics):
        request.metrics[i].metricId = getattr(b, metric)
    if call("nvmlGpmMetricsGet", request) is None:
        return {}
    out: dict[str, float | None] = {}
    for i, (key, _) in enumerate(metrics):
        metric = request.metrics[i]
        ok = int(metric.nvmlReturn) == int(b.NVML_SUCCESS)
        out[key] = round(float(metric.value), 3) if ok else None
    if gpu.pcie_gpm is None:  # the first answer decides: GPM's PCIe rates, or the fallback
        gpu.pcie_gpm = all(out.get(k) is not None for k, _ in GPM_PCIE)
    return out


def free_gpm(nvml: Nvml, gpu: GpuState) -> None:
    """Free the GPU's sample buffers; its PCIe rates come from the fallback from then on."""
    samples, gpu.gpm_samples, gpu.gpm_taken_at = gpu.gpm_samples, [], None
    gpu.pcie_gpm = False
    for sample in samples:
        try:
            nvml.call("nvmlGpmSampleFree", sample)
        except GpuLost:
            continue  # the buffer is host memory; a lost GPU does not matter here
