"""Distributed jobs: a straggler rank that the other ranks wait for in collectives.

The numbers come from the straggler search (doctor.analyse.distributed, in the evidence as
``stragglers``); this module words the finding and picks fixes that fit the slow rank's likely
cause (its own input pipeline, its compute, or the CPU it shares with other work).
"""

from __future__ import annotations

from typing import Any

from doctor.analyse.distributed import HOST_CONTENTION, Straggler
from doctor.analyse.evidence import Evidence
from doctor.rules.base import RuleSkipped, rule
from doctor.rules.input_model import main_loader
from doctor.verdict import Finding, Fix

MAX_NAMED = 8  # slow ranks named in the title and evidence; the rest are counted


@rule("distributed.straggler", needs=("stragglers",))
def straggler(ev: Evidence) -> list[Finding]:
    search = ev.stragglers
    assert search is not None
    found = search.stragglers
    if not found and search.window_only:
        rank, extra = next(iter(search.window_only.items()))
        raise RuleSkipped(f"rank {rank} looked {extra * 1e3:.1f} ms a step slower in the "
                          "profiler window's split only, not step by step outside backward(): "
                          "too few steps to call it a straggler")
    if not found:
        return []
    first = found[0]
    return [_finding(first, found, ev)]


def _finding(s: Straggler, found: list[Straggler], ev: Evidence) -> Finding:
    share = s.extra_s / s.step_s if s.step_s > 0 else 0.0
    cause = _cause_words(s)
    waiting = sorted(s.waiting)
    if waiting:
        who = _ranks_words(waiting)
        wait = sum(s.waiting.values()) / len(s.waiting)
        waits = f"; {who} wait{'s' if len(waiting) == 1 else ''} for it in collectives " \
                f"({wait * 1e3:.1f} ms a step)"
    else:
        wait = 0.0
        waits = ""
    more = f" (and {len(found) - 1} more slow rank(s))" if len(found) > 1 else ""
    title = (f"Rank {s.rank} is a straggler: {s.extra_s * 1e3:.1f} ms more per step than the "
             f"other ranks ({share:.0%} of a step), in {cause}{waits}{more}")
    evidence: dict[str, Any] = {
        "slow_rank": s.rank,
        "extra_per_step_s": s.extra_s,
        "extra_share_of_step": share,
        "step_s": s.step_s,
        "slower_in_fraction_of_steps": s.slower_fraction,
        "steps_compared": s.steps,
        "likely_cause": s.cause,
        "cause_category": s.cause_category,
        **{f"extra_{c}_per_step_s": v for c, v in s.extra_by_category.items()
           if abs(v) >= 0.01 * s.extra_s},
        "waiting_ranks": waiting[:MAX_NAMED * 8],
        "wait_per_step_s": wait,
        "slow_ranks": [x.rank for x in found][:MAX_NAMED],
    }
    if s.cpu_extra_s is not None:
        evidence["extra_cpu_per_step_s"] = s.cpu_extra_s
    return Finding(
        id="distributed.straggler", category=_category(s),
        severity="critical" if share >= 0.2 else "warning",
        title=title, evidence=evidence, fixes=_fixes(s, ev),
        estimated_speedup=s.step_s / (s.step_s - s.extra_s) if s.step_s > s.extra_s else None,
    )


def _category(s: Straggler) -> str:
    return "compute" if s.cause == HOST_CONTENTION else s.cause_category


def _cause_words(s: Straggler) -> str:
    if s.cause == "input":
        return f"its own input pipeline ({s.cause_category})"
    if s.cause == HOST_CONTENTION:
        return "compute that its CPU time does not account for (host contention)"
    if s.cause == "other":
        return "time outside its recorded ops (logging, checkpoints, evaluation, Python)"
    return f"its own {s.cause}"


def _ranks_words(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    shown = ", ".join(str(r) for r in ranks[:MAX_NAMED])
    rest = f" and {len(ranks) - MAX_NAMED} more" if len(ranks) > MAX_NAMED else ""
    return f"ranks {shown}{rest}"


def _fixes(s: Straggler, ev: Evidence) -> tuple[Fix, ...]:
    r = s.rank
    if s.cause == "input":
        workers = main_loader(ev.loaders).get("num_workers")
        cores = ev.job.cores or 1
        ranks_here = max(1, ev.job.ranks_here)
        want = max(1, cores // ranks_here - 1)
        return (
            Fix(
                title=f"Find why rank {r}'s data is slower: its shard, its storage, its samples",
                why="every rank loads with the same code, so a slower rank usually reads a "
                    "different shard (larger files, longer sequences), from slower storage, "
                    "or runs extra per-sample work on that rank only",
                code=f"# time rank {r}'s loader alone, without the model:\n"
                     "import time\nt = time.perf_counter()\n"
                     "for i, batch in zip(range(50), loader):\n    pass\n"
                     "print(dist.get_rank(), (time.perf_counter() - t) / 50)",
            ),
            Fix(
                title=f"Load in the background on every rank (num_workers {workers} -> {want})"
                if workers is not None else "Load in the background on every rank",
                why="with workers, a slower sample costs the slow rank less of its step; "
                    f"{cores} cores shared by {ranks_here} rank(s) on this node",
                code=f"loader = DataLoader(dataset, batch_size=..., num_workers={want},\n"
                     "                    persistent_workers=True, prefetch_factor=4)",
            ),
            Fix(
                title="Give each rank an equal share of samples",
                why="DistributedSampler splits indices evenly; uneven hand-made shards make "
                    "one rank wait on the longest",
                code="from torch.utils.data.distributed import DistributedSampler\n"
                     "sampler = DistributedSampler(dataset, shuffle=True)\n"
                     "loader = DataLoader(dataset, batch_size=..., sampler=sampler)",
            ),
        )
    if s.cause == HOST_CONTENTION:
        return (
            Fix(
                title=f"Give rank {r} cores of its own",
                why="its extra step time is not extra CPU work: it was waiting for a core "
                    "(other processes, or more threads than cores on its node)",
                code="# one process per core set, and threads to match:\n"
                     "OMP_NUM_THREADS=<cores per rank> torchrun --nproc-per-node N train.py\n"
                     "# or in the script:\ntorch.set_num_threads(<cores per rank>)",
            ),
            Fix(
                title=f"Check what else runs on rank {r}'s node",
                why="a busy node (another job, a monitoring agent, data loading for other "
                    "ranks) slows every collective of the job",
                code="top -o %CPU   # or: ps -eo pid,pcpu,comm --sort=-pcpu | head",
            ),
        )
    if s.cause == "other":
        return (
            Fix(
                title=f"Move rank {r}'s extra work off the training step",
                why="work only one rank does (logging, metrics, checkpoints, evaluation) "
                    "makes every other rank wait for it at the next collective",
                code="if step % 100 == 0 and dist.get_rank() == 0:\n"
                     "    log_metrics(...)  # rarely, not every step; or in a background thread",
            ),
        )
    return (
        Fix(
            title=f"Balance the work per rank: rank {r} computes more per step",
            why="in data-parallel training every rank should see the same amount of work; "
                "variable-length samples or rank-specific code make one rank slower",
            code="# bucket variable-length samples by length so every rank's batch costs the\n"
                 "# same, and look for code that runs on one rank only (if rank == ...:)",
        ),
    )
