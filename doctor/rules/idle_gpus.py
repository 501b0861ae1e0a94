"""A job that computed on the CPU while the machine's GPUs sat idle (doctor.analyse.idle_gpus):
torch cannot use a GPU (a CPU build, or no driver it reaches), or the model never moved to one.
"""

from __future__ import annotations

from doctor.analyse.evidence import Evidence
from doctor.analyse.idle_gpus import IdleGpus
from doctor.rules.base import rule
from doctor.verdict import Finding, Fix

IDLE = 0.10  # the busiest GPU's mean utilisation below which the machine's GPUs sat idle

CHECK = "python -c \"import torch; print(torch.__version__, torch.version.cuda, " \
        "torch.cuda.is_available())\""

INSTALL_CUDA_BUILD = Fix(
    title="Install a CUDA build of torch",
    why="torch.cuda.is_available() was False in the job: a CPU build of torch (its version ends "
        "in +cpu, torch.version.cuda is None), or a CUDA build that cannot reach the driver "
        "(nvidia-smi works, yet the build is newer than the driver)",
    code=f"{CHECK}\npip install torch --index-url https://download.pytorch.org/whl/cu126  "
         "# the CUDA version your driver supports (nvidia-smi says it)")

MOVE_TO_GPU = Fix(
    title="Move the model and each batch to the GPU",
    why="torch saw the GPU (torch.cuda.is_available() was True) but the job never initialised "
        "CUDA: the model's parameters stayed on the CPU",
    code="device = torch.device(\"cuda\")\nmodel = model.to(device)  # before building the "
         "optimizer\nfor x, y in loader:\n    x = x.to(device, non_blocking=True)\n"
         "    y = y.to(device, non_blocking=True)")


@rule("gpu.unused", needs=("idle_gpus",))
def unused(ev: Evidence) -> list[Finding]:
    idle = ev.idle_gpus
    assert idle is not None  # guaranteed by needs
    if idle.busiest_util >= IDLE:
        return []  # something used them: not idle, and not this job's to claim
    hidden = idle.hidden
    fixes = _fixes(idle)
    names = sorted({n for n in idle.names if n})
    which = f" ({', '.join(names)})" if names else ""
    gpus = "GPU" if idle.count == 1 else f"{idle.count} GPUs"
    title = f"The job computed on the CPU while the machine's {gpus}{which} sat idle"
    if hidden:
        title += " (hidden from it by CUDA_VISIBLE_DEVICES=\"\")"
    return [Finding(
        id="gpu.unused", category="compute", severity="info" if hidden else "critical",
        title=title,
        evidence={"gpus": idle.count, "gpu_names": names,
                  "busiest_gpu_util": idle.busiest_util,
                  "torch_cuda_available": idle.torch_cuda, "torch_version": idle.torch_version,
                  "cuda_visible_devices": idle.visible_devices},
        fixes=fixes,
    )]


def _fixes(idle: IdleGpus) -> tuple[Fix, ...]:
    """The fix for the cause torch's own word points at; both, with how to tell them apart,
    where it said nothing."""
    if idle.torch_cuda is False:
        return (INSTALL_CUDA_BUILD,)
    if idle.torch_cuda is True:
        return (MOVE_TO_GPU,)
    return (Fix(title="Find which of the two it is",
                why="torch.cuda.is_available() False: torch cannot use a GPU (install a CUDA "
                    "build); True: the model never moved to the GPU (move it)",
                code=CHECK),
            INSTALL_CUDA_BUILD, MOVE_TO_GPU)
