"""Drive health from SMART: ``smartctl --json`` documents in, verdicts with reasons out.

One module a job, each importing only those before it (``parse`` <- ``verdict`` <- ``history``
<- ``source``; ``runner`` needs only ``parse`` and ``verdict``):

* :mod:`.parse` -- the pure, total parser of ATA, NVMe and SCSI documents (:class:`DriveHealth`,
  the thresholds);
* :mod:`.verdict` -- the verdict from a document's findings and the growth of its counters;
* :mod:`.history` -- the SMART state file, the baseline growth is judged from, the trend
  forecast, and :func:`explain_series` for saved documents;
* :mod:`.runner` -- the only code that runs ``smartctl`` (argv, device names, fixes);
* :mod:`.source` -- :func:`check_drives` (one check, for ``stallscope disk`` and ``run --data``)
  and :class:`SmartSource` (the ``smart.*`` metrics).

The verdict rules and thresholds are documented in ``docs/disk-health.md``.
"""

from __future__ import annotations

from stallscope.sources.smart.history import (
    MAX_CHECKS,
    WINDOW_S,
    Check,
    Forecast,
    HealthState,
    default_state_path,
    drive_levels,
    explain_series,
    forecast,
    forecast_drive,
    pick_baseline,
)
from stallscope.sources.smart.parse import (
    MEDIUM_FAIL_AT,
    DriveHealth,
    Growth,
    Verdict,
    iso_time,
)
from stallscope.sources.smart.runner import (
    read_smart,
    smartctl_argv,
    validate_device,
    validate_device_type,
)
from stallscope.sources.smart.source import (
    SMART_EVERY_S,
    SmartSource,
    check_drives,
    drive_points,
)
from stallscope.sources.smart.verdict import (
    apply_growth,
    compute_growth,
    parse_smartctl,
    parse_smartctl_text,
)

__all__ = [
    "MAX_CHECKS",
    "MEDIUM_FAIL_AT",
    "SMART_EVERY_S",
    "WINDOW_S",
    "Check",
    "DriveHealth",
    "Forecast",
    "Growth",
    "HealthState",
    "SmartSource",
    "Verdict",
    "apply_growth",
    "check_drives",
    "compute_growth",
    "default_state_path",
    "drive_levels",
    "drive_points",
    "explain_series",
    "forecast",
    "forecast_drive",
    "iso_time",
    "parse_smartctl",
    "parse_smartctl_text",
    "pick_baseline",
    "read_smart",
    "smartctl_argv",
    "validate_device",
    "validate_device_type",
]
