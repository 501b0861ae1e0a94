"""What doctor.watch's sampler thread (host at 1 Hz, GPUs at 2 Hz) costs: its CPU seconds over
the run's wall seconds, as a share of one core (the budget: about 1 %).

A job under doctor.watch runs a torch loop for ``--seconds``; run.json records the thread's CPU
time (``sampler_cpu_s``). With ``--fake-gpus N`` NVML is a fake of N GPUs (tests.fake_nvml): the
Python side of the GPU sampler, not the driver's own time in each NVML call, which only a GPU
machine measures (bench/gpu_check.sh's runs record it the same way).

    python bench/watch_sampler.py --seconds 20 --fake-gpus 0,8
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

JOB = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    gpus = {gpus}
    if gpus:
        from tests.fake_nvml import FakeGpu, FakeNvml
        sys.modules["pynvml"] = FakeNvml([FakeGpu() for _ in range(gpus)])
    import torch
    import doctor
    model = torch.nn.Linear(256, 256)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with doctor.watch(out={out!r}, report=False):
        end = time.monotonic() + {seconds}
        while time.monotonic() < end:
            loss = model(torch.randn(64, 256)).pow(2).mean()
            opt.zero_grad(); loss.backward(); opt.step()
""")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--fake-gpus", default="0,8")
    args = ap.parse_args()
    print(f"{'gpus':>4} {'wall_s':>7} {'sampler_cpu_s':>13} {'share of a core':>15}")
    for gpus in (int(g) for g in args.fake_gpus.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            out = str(Path(tmp) / "run")
            script = JOB.format(root=str(ROOT), gpus=gpus, out=out, seconds=args.seconds)
            subprocess.run([sys.executable, "-c", script], check=True)
            record = json.loads((Path(out) / "run.json").read_text())
            cpu, wall = record["sampler_cpu_s"], record["duration_s"]
            print(f"{gpus:4d} {wall:7.1f} {cpu:13.3f} {cpu / wall:15.2%}")


if __name__ == "__main__":
    main()
