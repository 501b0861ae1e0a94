"""Communication rules over the profiler window: collectives not hidden behind compute.

The time ranks spend in collectives waiting for a straggler (doctor.rules.distributed) is the
straggler's: it is taken out of the exposed communication, so that one cause is not reported
twice."""

from __future__ import annotations

from doctor.rules.base import rule
from doctor.rules.evidence import Evidence
from doctor.rules.window import means, window_finding, window_steps
from doctor.verdict import Finding, Fix

NO_SYNC = Fix(
    title="Accumulate gradients locally with no_sync()",
    why="with gradient accumulation, only the last micro-batch needs an all-reduce",
    code=(
        "import contextlib\n"
        "for i, (inputs, targets) in enumerate(loader):\n"
        "    last = (i + 1) % accumulation_steps == 0\n"
        "    ctx = contextlib.nullcontext() if last else model.no_sync()\n"
        "    with ctx:\n"
        "        loss_fn(model(inputs), targets).backward()\n"
        "    if last:\n"
        "        optimizer.step()\n"
        "        optimizer.zero_grad()"
    ),
)
COMPRESS = Fix(
    title="Compress gradients before the all-reduce",
    why="halving the bytes on the wire halves bandwidth-bound collectives",
    code=(
        "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks\n"
        "model.register_comm_hook(None, default_hooks.bf16_compress_hook)"
    ),
)


def straggler_wait(ev: Evidence, frame_ranks: int) -> float:
    """Seconds a step the ranks spend, on average, waiting in collectives for a straggler (its
    finding's cause, not the communication's)."""
    search = ev.stragglers
    if search is None or not search.stragglers or frame_ranks <= 0:
        return 0.0
    return sum(sum(s.waiting.values()) for s in search.stragglers) / frame_ranks


@rule("comm.exposed", needs=("window",))
def exposed_communication(ev: Evidence) -> list[Finding]:
    f = window_steps(ev, device=None)
    step, comm, exposed_all = means(f, "dur_s", "comm_s", "comm_exposed_s")
    waited = min(straggler_wait(ev, int(f["rank"].nunique()) if "rank" in f else 1),
                 exposed_all)
    exposed = exposed_all - waited  # waiting for a straggler is the straggler's finding
    share = exposed / step
    if share < 0.05:
        return []
    world = ev.job.world_size
    overlapped = 1.0 - exposed / comm if comm > 0 else 0.0
    on_gpu = bool((f["device"] == "cuda").any()) if "device" in f else True
    ddp_devices = " device_ids=[local_rank]," if on_gpu else ""
    return [window_finding(
        "comm.exposed", "communication", share=share, bands=(0.2, 0.05),
        title=(
            f"Collectives take {share:.0%} of the step with no compute beside them "
            f"({overlapped:.0%} of communication is overlapped)"
        ),
        evidence=dict(comm_s_per_step=comm, comm_exposed_s_per_step=exposed,
                      waiting_for_straggler_s_per_step=waited,
                      comm_exposed_share=share, comm_overlapped_fraction=overlapped,
                      world_size=world if isinstance(world, int) else None),
        fixes=(
            Fix(
                title="Tune DDP's gradient buckets",
                why="all-reduce starts when a bucket fills; smaller buckets start earlier in "
                    "backward and overlap more, larger ones cost fewer launches (default 25 MB)",
                code=(
                    "model = torch.nn.parallel.DistributedDataParallel(\n"
                    f"    model,{ddp_devices}\n"
                    "    bucket_cap_mb=50, gradient_as_bucket_view=True, static_graph=True,\n"
                    ")"
                ),
                # static_graph is left to the user: it breaks a model whose graph changes
                apply={"ddp": {"bucket_cap_mb": 50, "gradient_as_bucket_view": True}},
            ),
            NO_SYNC,
            COMPRESS,
        ),
        step_s=step, removed_s=exposed,
    )]
