"""Test support shipped with the package: replays of recorded real NVML readings, for machines
without a GPU (CI). Nothing here runs in a normal ``stallscope`` command."""
