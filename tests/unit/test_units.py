"""Sizes and rates for people come from one module, in SI (stallscope/units.py)."""

from __future__ import annotations

import pytest

from stallscope import units


@pytest.mark.parametrize(
    "n,text",
    [
        (0, "0 B"),
        (512, "512 B"),
        (999, "999 B"),
        (1000, "1.0 kB"),
        (6200, "6.2 kB"),
        (36e6, "36 MB"),
        (6.2e9, "6.2 GB"),
        (1.4e12, "1.4 TB"),
        (12_345e12, "12,345 TB"),
    ],
)
def test_size_is_si(n: float, text: str) -> None:
    assert units.size(n) == text


def test_kernel_kb_and_mib_are_binary_and_shown_in_si() -> None:
    # iostat's 1,953.125 "kB"/s is 2,000,000 B/s: a 2 MB/s cgroup limit reads as one
    assert units.rate(units.kib(1953.125)) == "2.0 MB/s"
    assert units.size(units.mib(1024)) == "1.1 GB"  # 1 GiB
    assert units.kib(1) == 1024 and units.mib(1) == 1024 * 1024


def test_top_shows_kernel_kb_rates_in_si_units() -> None:
    """top divided KiB/s by 1,024 and called the result MB/s."""
    from stallscope.live.view import _rate

    assert _rate(1953.125) == "2.0 MB/s" and _rate(None) == "-" and _rate(float("nan")) == "-"
    assert _rate(812) == "831 kB/s" and _rate(55e6) == "56 GB/s"
