"""The machine's own roofline: what a GEMM reaches (FLOP/s, per dtype) and what a copy reaches
(bytes/s), on the CPU and, where torch sees one, on the GPU.

``doctor run`` measures it after the job has exited (so that it costs the job nothing), in a
child process of the job's own interpreter (torch as the job has it; the doctor parent never
imports torch), and keeps it per machine, torch build and device in a cache file, so that one
machine pays the second or so once. Each figure is the best of a few timed repetitions of one
size: large enough to reach the roof, small enough to take a fraction of a second.

    python probes/peaks.py        # prints the peaks as JSON
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

GEMM_SIZE = {"cpu": 1024, "cuda": 8192}
COPY_BYTES = {"cpu": 64 << 20, "cuda": 1 << 30}
REPEATS = 5
DTYPES = ("float32", "bfloat16", "float16")
TIMEOUT_S = 120.0
#: A measurement taken by an earlier version of this file is taken again.
MEASUREMENT = 2  # 2: TF32 on GPUs


def _best(run: Any, sync: Any, repeats: int = REPEATS) -> float:
    run()  # warm-up: allocation, kernel selection, threads starting
    sync()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        sync()
        best = min(best, time.perf_counter() - t0)
    return best


def measure(device: str) -> dict[str, Any]:
    """{"gemm_flops": {dtype: FLOP/s}, "copy_bytes_s": bytes/s, "name": ...} on ``device``."""
    import torch

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    n = GEMM_SIZE[device]
    flops: dict[str, float] = {}
    for name in DTYPES:
        dtype = getattr(torch, name)
        if device == "cpu" and name == "float16":
            continue  # no fast fp16 GEMM on CPUs; bf16 is the CPU's half type
        try:
            a = torch.randn(n, n, device=device).to(dtype)
            b = torch.randn(n, n, device=device).to(dtype)
            seconds = _best(lambda a=a, b=b: torch.mm(a, b), sync)
            flops[name] = 2.0 * n ** 3 / seconds
        except Exception:  # a dtype this build or device does not multiply: no roof for it
            continue
    if device == "cuda" and "float32" in flops:
        tf32 = _tf32_flops(n, sync)
        if tf32 is not None and tf32 > 1.2 * flops["float32"]:  # Tensor Cores took it
            flops["tf32"] = tf32
    src = torch.empty(COPY_BYTES[device] // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    seconds = _best(lambda: dst.copy_(src), sync)
    name = torch.cuda.get_device_name() if device == "cuda" else _cpu_name()
    return {"device": device, "name": name, "gemm_flops": flops,
            "copy_bytes_s": 2.0 * src.numel() * 4 / seconds,  # read and written
            "threads": torch.get_num_threads(), "torch": str(torch.__version__)}


def _tf32_flops(n: int, sync: Any) -> float | None:
    """An fp32 GEMM with TF32 allowed (Tensor Cores from Ampere on), the setting restored."""
    import torch

    matmul = torch.backends.cuda.matmul
    before = matmul.allow_tf32
    try:
        matmul.allow_tf32 = True
        a = torch.randn(n, n, device="cuda")
        b = torch.randn(n, n, device="cuda")
        return 2.0 * n ** 3 / _best(lambda: torch.mm(a, b), sync)
    except Exception:  # no TF32 here: the fp32 roof stands alone
        return None
    finally:
        matmul.allow_tf32 = before


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


def measure_all() -> dict[str, Any]:
    import torch

    out = {"cpu": measure("cpu")}
    if torch.cuda.is_available():
        out["cuda"] = measure("cuda")
    return out


def cache_path() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "doctor" / f"peaks-{socket.gethostname()}.json"


def machine_peaks(python: str = sys.executable, cache: Path | None = None) -> dict[str, Any] | None:
    """The peaks of this machine for ``python``'s torch: from the cache when measured before
    with the same interpreter, else measured now in a child process (None if that fails)."""
    cache = cache or cache_path()
    key = f"{os.path.realpath(python)} (measurement {MEASUREMENT})"
    try:
        known = json.loads(cache.read_text())
    except (OSError, json.JSONDecodeError):
        known = {}
    if isinstance(known, dict) and isinstance(known.get(key), dict):
        return dict(known[key])
    try:
        # this file by its path: it needs torch and the standard library, not doctor
        result = subprocess.run([python, str(Path(__file__).resolve())], capture_output=True,
                                text=True, timeout=TIMEOUT_S, check=False)
        peaks = json.loads(result.stdout) if result.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError):
        peaks = None
    if not isinstance(peaks, dict):
        return None
    from ..store.safe_files import write_text_atomic  # not at the top: run by path, it has none

    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(cache, json.dumps({**(known if isinstance(known, dict) else {}),
                                             key: peaks}))
    except OSError:
        pass  # measured again next time
    return peaks


if __name__ == "__main__":
    print(json.dumps(measure_all()))
