"""The machine's roofline (doctor.probes.peaks): a plausible CPU GEMM peak, measured once per
machine and interpreter, then read from the cache."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from doctor.probes.peaks import machine_peaks, measure


def numpy_gemm_flops(n: int = 1024, repeats: int = 5) -> float:
    a = np.random.default_rng(0).random((n, n), dtype=np.float32)
    a @ a
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best


def test_the_cpu_gemm_peak_is_of_numpys_order() -> None:
    peaks = measure("cpu")
    ratio = peaks["gemm_flops"]["float32"] / numpy_gemm_flops()
    assert 0.2 < ratio < 5.0  # the same BLAS-class machine, not a time
    assert peaks["copy_bytes_s"] > 1e8


def test_peaks_are_measured_once_then_cached(tmp_path: Path) -> None:
    cache = tmp_path / "peaks.json"
    first = machine_peaks(sys.executable, cache)
    assert first is not None and first["cpu"]["gemm_flops"]["float32"] > 0
    assert cache.is_file()
    again = machine_peaks(sys.executable, cache)
    assert again == first  # read back, not measured again
    assert machine_peaks("/nonexistent/python", tmp_path / "other.json") is None


def test_a_measurement_of_an_earlier_kind_is_taken_again(tmp_path: Path) -> None:
    import json
    import os

    cache = tmp_path / "peaks.json"
    stale = {"cpu": {"gemm_flops": {"float32": 1.0}, "copy_bytes_s": 1.0}}
    cache.write_text(json.dumps({os.path.realpath(sys.executable): stale}))
    fresh = machine_peaks(sys.executable, cache)
    assert fresh is not None and fresh["cpu"]["gemm_flops"]["float32"] > 1e6
