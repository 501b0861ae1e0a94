"""Input rules: how long the loop waits for batches, which stage of loading costs it (io, decode,
preprocess), and the loader settings or stage changes that fit this job. The estimates come from
the loading model of doctor.rules.input_model.
"""

from __future__ import annotations

from typing import Any

from doctor.analyse.evidence import Evidence
from doctor.analyse.reads import read_pattern
from doctor.categories import INPUT_STAGES
from doctor.rules.base import rule
from doctor.rules.input_bursts import bursts
from doctor.rules.input_model import InputFacts, count_of, suggested_workers
from doctor.rules.input_reads import io_cause
from doctor.rules.input_remote import MAX_WORKERS, REMOTE, in_flight_needed, speedup_in_flight
from doctor.verdict import Finding, Fix

MIN_SHARE = 0.10
COLLATE_SHARE = 0.25  # of loading time, above which the collate_fn gets its own fix
STAGES = INPUT_STAGES
# Of the wait with workers, the share the tensor handoff alone explains above which the workers
# keep up (slow workers make the wait many times the handoff; the measured round trip leaves
# out the loader's own per-batch work, so the handoff reads low).
KEEP_UP_HANDOFF = 0.3
WAITING = 0.5  # of loading in reads, above which the workers wait rather than compute


def input_severity(share: float) -> str:
    return "critical" if share >= 0.5 else "warning" if share >= 0.2 else "info"


@rule("input.loader", needs=("ledger", "loaders"))
def input_loader(ev: Evidence) -> list[Finding]:
    """The loop waits for batches: settings of the DataLoader that would hide the wait."""
    x = InputFacts(ev)
    if x.share < MIN_SHARE:
        return []
    evidence: dict[str, Any] = {
        "input_wait_share": x.wait_share, "input_share_with_contention": x.share,
        "wait_s": x.wait, "step_s": x.step,
        "cores": x.cores, "other_load_cores": x.other_load, "num_workers": x.workers,
        "batch_size": x.loader.get("batch_size"),
        "persistent_workers": x.loader.get("persistent_workers"),
        "prefetch_factor": x.loader.get("prefetch_factor"),
        "batch_tensors": count_of(x.loader.get("batch_tensors")), "batch_handoff_s": x.handoff,
    }
    fixes: list[Fix] = []
    speedup = None
    busy = ev.worker_cpu_cores  # summed over workers, during analysed steps
    evidence["worker_busy_cores"] = busy
    waits = x.stage_shares.get("io", 0.0) >= WAITING  # the loading waits on reads, holds no core
    if x.workers == 0 and waits and (more := _more_workers(x, None)) is not None:
        speedup = more.estimated_speedup
        fixes.append(more)
    elif x.workers == 0:
        k = suggested_workers(x.free_cores)
        speedup = round(x.step / x.step_after(x.load, k), 9)  # no float dust below 1.0
        others = (f", {x.other_load:.1f} of them busy with other processes"
                  if x.other_load else "")
        bound = (f"{x.free_cores:.3g} free cores bound the gain to about {speedup:.1f}x"
                 if speedup >= 1.0 else "the other processes leave the workers no core")
        if x.other_load:  # what workers give once the machine is the job's alone
            alone = suggested_workers(x.cores)
            gain = x.step / x.step_after(x.load, alone, cores=x.cores)
            bound += (f"; without the other load, {alone} workers on {x.cores} cores: about "
                      f"{gain:.1f}x")
        speedup = speedup if speedup >= 1.0 else None
        fixes.append(Fix(
            title=f"num_workers=0 on a {x.cores}-core machine{others}: set num_workers={k}",
            why=(f"Batches are built in the training process, which waits {x.wait:.3g} s of "
                 f"each {x.step:.3g} s step. Workers build the next batches while the model "
                 f"trains; {bound}."),
            code=(f"loader = DataLoader(dataset, {x.batch}, "
                  f"num_workers={k},\n                    persistent_workers=True, "
                  "prefetch_factor=4)"),
            apply={"dataloader": {"num_workers": k, "persistent_workers": True}},
            estimated_speedup=speedup,
        ))
    elif ev.ledger is not None and (burst := bursts(
            ev.ledger, x.workers, count_of(x.loader.get("prefetch_factor")),
            ev.worker_fetch_s)) is not None:
        evidence.update(burst_wait_s=burst.burst_s, burst_steps=burst.bursts,
                        suggested_prefetch_factor=burst.suggested)
        speedup = burst.speedup
        fixes.append(burst.fix(x.workers))
    elif x.handoff > 0 and x.handoff >= KEEP_UP_HANDOFF * x.wait:
        fixes.append(Fix(
            title=f"The {x.workers} workers keep up: the wait is taking their batches",
            why=f"About {x.handoff:.2g} s of the {x.wait:.2g} s wait is the handoff of each "
                "batch's tensors, one round trip to the worker each: more workers cannot help"
                + ("; see the handoff finding." if x.handoff >= MIN_SHARE * x.step else "."),
            code="",
        ))
    elif (more := _more_workers(x, busy)) is not None:
        speedup = more.estimated_speedup
        fixes.append(more)
    else:
        fixes.append(Fix(
            title=f"{x.workers} workers keep the cores busy: more workers cannot help",
            why="The cores are saturated, so the loading itself must get cheaper: see the "
                "finding for the stage that costs the most.",
            code="",
        ))
    if x.workers > 0 and not x.loader.get("persistent_workers"):
        fixes.append(Fix(
            title="persistent_workers=False: keep workers between epochs",
            why="Each epoch otherwise starts its workers again, a stall at every epoch.",
            code=f"DataLoader(dataset, {x.batch}, num_workers={x.workers}, "
                 "persistent_workers=True)",
            apply={"dataloader": {"persistent_workers": True}},
        ))
    category = x.dominant()
    return [Finding(
        id="input.loader", category=category, severity=input_severity(x.share),
        title=(f"The training loop waits for input {x.wait_share:.0%} of the time"
               + (f", and for cores its workers hold {x.share - x.wait_share:.0%}"
                  if x.share - x.wait_share >= 0.01 else "")),
        evidence=evidence, fixes=tuple(fixes), estimated_speedup=speedup,
    )]


def _at_least_its_fixes(removed: float, fixes: tuple[Fix, ...]) -> float:
    """Removing a stage gives at least what any of its fixes gives: a remote store's waits
    come unevenly, so the medians the stage's estimate starts from can read it lower than the
    means its fixes are sized from."""
    return max([removed, *(f.estimated_speedup for f in fixes if f.estimated_speedup)])


def _more_workers(x: InputFacts, busy: float | None) -> Fix | None:
    """More workers, where they would help: cores are idle, or the workers wait on reads or
    a remote store (holding no core: more of them than cores keep more reads in flight)."""
    waiting = x.stage_shares.get("io", 0.0)
    if busy is not None and x.free_cores - busy >= 1.0 and x.workers < MAX_WORKERS:
        k = min(MAX_WORKERS, x.workers + int(x.free_cores - busy))
        title = f"num_workers={x.workers} with {x.free_cores - busy:.1f} idle cores"
        why = "The workers cannot keep up and cores are idle: more workers load more batches " \
              "at once."
        waiting = 0.0
    elif waiting >= WAITING and x.workers < MAX_WORKERS:
        k = min(MAX_WORKERS, in_flight_needed(x))
        title = (f"The {x.workers} workers wait on reads" if x.workers else
                 "num_workers=0, and the loading waits on reads") + f" ({waiting:.0%} of loading)"
        why = "Workers blocked in reads or fetches hold no core, so more of them than cores " \
              "keep more reads in flight; see the io finding for the cause."
    else:
        return None
    return Fix(title=f"{title}: set num_workers={k}", why=why,
               code=f"loader = DataLoader(dataset, {x.batch}, num_workers={k}, "
                    "persistent_workers=True)",
               apply={"dataloader": {"num_workers": k, "persistent_workers": True}},
               estimated_speedup=speedup_in_flight(x, k, waiting) if waiting else
               x.step / x.step_after(x.load, k))


@rule("input.unsplit", needs=("ledger",))
def input_unsplit(ev: Evidence) -> list[Finding]:
    """Input wait that could not be split: say so, why, and how to split it. Where the loader's
    settings are unknown (a trace), the estimate is the bound of hiding the wait entirely;
    otherwise input.loader estimates from the settings."""
    x = InputFacts(ev)
    if x.share < MIN_SHARE or x.measured:
        return []
    why = ev.unsplit_reason or "no stack samples of the loading code were taken"
    fixes = [Fix(
        title="Let doctor split the wait",
        why="a trace cannot see inside the loading code; `doctor run -- python train.py` splits "
            "this wait into io, decode and preprocess and names the fix",
    ) if ev.traces is not None else Fix(
        title="Run long enough for the profiling window",
        why="The split comes from stack samples taken during the window that opens after "
            "warm-up (step 8 by default): run 20 steps or more, or move it with "
            "--window START,STEPS.",
    )]
    known = ev.loaders is not None and not ev.loaders.empty
    if not known:
        pin = " pin_memory=True," if ev.job.device == "cuda" else ""
        fixes.append(Fix(
            title="Load batches in worker processes, ahead of the step",
            why="with num_workers=0 the main process loads every batch while the step waits",
            code="loader = torch.utils.data.DataLoader(\n"
                 f"    dataset, batch_size=batch_size, num_workers=4,{pin}\n"
                 "    persistent_workers=True, prefetch_factor=4,\n)"))
    return [Finding(
        id="input.unsplit", category="input",
        severity="critical" if x.share >= 0.2 else "warning",
        title=f"Input time ({x.share:.0%} of the step) could not be split into io, decode and "
              "preprocess",
        evidence={"input_wait_share": x.share, "input_s_per_step": x.share * x.mean_step,
                  "step_s": x.mean_step, "reason": why},
        fixes=tuple(fixes),
        estimated_speedup=None if known else 1.0 / max(1.0 - x.share, 0.05),
    )]


_STAGE_WORDS = {"io": "reading data from storage", "decode": "decoding samples",
                "preprocess": "transforms, augmentation and collation"}
_CAUSE_WORDS = {"remote store": "fetching data from a remote store",
                "network filesystem": "reading data from a network filesystem"}


@rule("input.stage", needs=("ledger", "input_split"))
def input_stage(ev: Evidence) -> list[Finding]:
    """One finding per loading stage that costs a real share of the step."""
    x = InputFacts(ev)
    if not x.measured or x.share < MIN_SHARE:
        return []
    findings = []
    for stage in STAGES:
        frac = x.stage_shares.get(stage, 0.0)
        share = x.share * frac
        if share < MIN_SHARE:
            continue
        workers = max(x.workers, 1)
        new_step = min(x.step, x.step_after(x.load * (1.0 - frac), workers)) if x.workers \
            else max(x.step - x.wait * frac, 1e-9)  # removing work never slows a step
        evidence: dict[str, Any] = {
            "share_of_step": share, "share_of_loading": frac, "step_s": x.step,
            "top_functions": x.top.get(stage, []), "num_workers": x.workers,
            "cores": x.cores, "batch_handoff_s": x.handoff if x.workers else None,
        }
        reads = read_pattern(ev.host) if stage == "io" else None
        fixes = _stage_fixes(stage, x, frac)
        if stage == "io":
            evidence["read_mb_per_s"] = _read_rate(ev)
            evidence.update(reads.to_evidence() if reads is not None else {})
            evidence["cause"], fixes = io_cause(x, frac, reads, ev.data_source, fixes,
                                                x.step / new_step)
            evidence.update(ev.data_source.to_evidence() if ev.data_source else {})
        if stage == "preprocess":
            evidence["collate_share_of_loading"] = x.collate_share
        findings.append(Finding(
            id=f"input.{stage}", category=stage, severity=input_severity(share),
            title=f"{share:.0%} of the step goes to "
                  + _CAUSE_WORDS.get(str(evidence.get("cause")), _STAGE_WORDS[stage]),
            evidence=evidence, fixes=fixes,
            estimated_speedup=_at_least_its_fixes(x.step / new_step, fixes)
            if evidence.get("cause") == REMOTE else x.step / new_step,
        ))
    return findings


@rule("input.handoff", needs=("ledger", "loaders"))
def input_handoff(ev: Evidence) -> list[Finding]:
    """Workers keep up, but taking each batch from them costs the training process a round trip
    per tensor: fewer tensors per batch, or a sharing strategy without the round trip."""
    x = InputFacts(ev)
    share = x.handoff / x.step if x.workers else 0.0
    if share < MIN_SHARE:
        return []
    tensors = count_of(x.loader.get("batch_tensors")) or 1
    per_tensor = x.handoff / tensors
    saved = x.handoff * (tensors - 1) / tensors  # packed into one tensor
    off_thread = x.step / max(x.step - x.handoff, 1e-9)  # no round trip on the training thread
    fixes = []
    if tensors > 1:
        fixes.append(Fix(
            title=f"Hand over one tensor per batch instead of {tensors}",
            why=f"Each tensor of a batch costs the training process a round trip to the worker "
                f"({per_tensor * 1e3:.2g} ms on this machine): pack same-shaped tensors in the "
                "collate_fn and split them in the training loop.",
            code="def collate(samples):\n    ids, mask = pad(samples)\n"
                 "    return torch.stack([ids, mask.to(ids.dtype)])\n\n"
                 "for packed in loader:\n    ids, mask = packed.unbind(0)"))
    fixes.append(Fix(
        title="Share tensors through named files: sharing strategy file_system",
        why="The default file_descriptor strategy asks the worker for each tensor's descriptor; "
            "file_system opens shared memory by name instead (a process killed mid-batch can "
            "leave files in /dev/shm).",
        code="import torch.multiprocessing\n"
             "torch.multiprocessing.set_sharing_strategy('file_system')",
        apply={"torch": {"sharing_strategy": "file_system"}}, estimated_speedup=off_thread))
    if ev.job.device == "cuda":
        fixes.append(Fix(
            title="pin_memory=True: a thread takes the batches off the training thread",
            why="The pin-memory thread receives each batch from the workers and pins it, "
                "overlapping the handoff with the step.",
            code=f"DataLoader(dataset, {x.batch}, num_workers={x.workers}, pin_memory=True)",
            apply={"dataloader": {"pin_memory": True}}, estimated_speedup=off_thread))
    return [Finding(
        id="input.handoff", category=x.dominant(), severity=input_severity(share),
        title=f"{share:.0%} of the step takes batches from the workers: {tensors} tensors, "
              "a round trip to the worker each",
        evidence={"share_of_step": share, "batch_handoff_s": x.handoff,
                  "batch_tensors": tensors, "fd_handoff_s": ev.fd_handoff_s,
                  "wait_s": x.wait, "step_s": x.step, "num_workers": x.workers},
        fixes=tuple(fixes),
        estimated_speedup=x.step / (x.step - saved) if saved > 0 else None,
    )]


def _stage_fixes(stage: str, x: InputFacts, frac: float) -> tuple[Fix, ...]:
    """The stage's fixes in their plain order (io: keep the data close, more concurrency,
    shards; doctor.rules.input_reads orders them by what the reads were)."""
    if stage == "io":
        more = min(32, max(2 * x.cores, x.workers * 2, 4))
        # reads wait rather than compute: only the rest of the loading shares the cores
        more_reads = x.step / x.step_after(x.load, more, waiting=frac)
        return (
            Fix(title="Keep the data close: cache it on local disk or in memory",
                why="Reads that miss the page cache wait on storage; a local copy (or "
                    "/dev/shm for small datasets) turns waits into memory copies.",
                code="import shutil\nshutil.copytree(remote_dir, '/dev/shm/dataset', "
                     "dirs_exist_ok=True)"),
            Fix(title=f"Read with more concurrency: num_workers={more}",
                why="Workers blocked in reads use little CPU: more of them than cores keeps "
                    "more reads in flight (remote and network storage especially).",
                code=f"DataLoader(dataset, {x.batch}, num_workers={more}, "
                     "prefetch_factor=4, persistent_workers=True)",
                apply={"dataloader": {"num_workers": more, "persistent_workers": True}},
                estimated_speedup=more_reads),
            Fix(title="Store samples in large sequential shards",
                why="One file per sample means one open and one random read each; tar shards "
                    "(WebDataset-style) are read sequentially.",
                code="import webdataset as wds\n"
                     "dataset = wds.WebDataset('shards/train-{000000..000099}.tar')"),
        )
    if stage == "decode":
        return (
            Fix(title="Decode once and cache the decoded arrays",
                why="The same files are decoded again every epoch.",
                code="import numpy as np\n"
                     "arrays = np.lib.format.open_memmap('decoded.npy', mode='w+', "
                     "dtype=np.uint8, shape=(n, h, w, 3))"),
            Fix(title="Use a faster decoder",
                why="pillow-simd, or torchvision.io.decode_jpeg on the GPU, or NVIDIA DALI, "
                    "decode several times faster than stock Pillow." if x.gpu else
                    "pillow-simd, or torchvision.io.decode_jpeg (libjpeg-turbo), decode "
                    "several times faster than stock Pillow.",
                code="from torchvision.io import decode_jpeg, read_file\n"
                     "image = decode_jpeg(read_file(path)"
                     + (", device='cuda')" if x.gpu else ")")),
            Fix(title="Store smaller images",
                why="Decoding cost grows with pixels: resize offline to the training size.",
                code="image.resize((256, 256)).save(out_path, quality=90)"),
        )
    fixes = []
    # torch's own default_collate is already vectorised: a rewrite would not help
    if (x.collate_share or 0.0) >= COLLATE_SHARE and \
            x.loader.get("collate_fn") != "default_collate":
        fixes.append(Fix(
            title=f"collate_fn {x.loader.get('collate_fn')} takes {x.collate_share:.0%} of "
                  "loading: vectorise it",
            why="Per-element Python in collation runs once per sample per step.",
            code="def collate(batch):\n    return torch.nn.utils.rnn.pad_sequence(\n"
                 "        [torch.as_tensor(x) for x in batch], batch_first=True)",
        ))
    fixes += [
        Fix(title="Augment whole batches on the GPU (or vectorised on the CPU)",
            why="Per-sample transforms in __getitem__ run in Python, one sample at a time.",
            code="batch = batch.to(device, non_blocking=True)\n"
                 "batch = torch.flip(batch, dims=[3]) if torch.rand(()) < 0.5 else batch")
        if x.gpu else
        Fix(title="Augment whole batches at once, vectorised",
            why="Per-sample transforms in __getitem__ run in Python, one sample at a time; "
                "one tensor op over the batch (in the collate_fn, in the workers) does them "
                "all.",
            code="def collate(samples):\n"
                 "    batch = torch.stack([torch.as_tensor(s) for s in samples])\n"
                 "    flip = torch.rand(len(batch)) < 0.5\n"
                 "    batch[flip] = batch[flip].flip(-1)\n    return batch"),
        Fix(title="Cache what does not change between epochs",
            why="Deterministic preprocessing (resizing, tokenising) can be done once.",
            code="cache = {}\ndef get(i):\n    if i not in cache:\n"
                 "        cache[i] = expensive_transform(raw[i])\n    return cache[i]"),
    ]
    return tuple(fixes)


def _read_rate(ev: Evidence) -> float | None:
    """MB/s read from storage by the job's processes, from the host probe."""
    host = ev.host
    if host is None or host.empty or "read_bytes" not in host:
        return None
    g = host.groupby([c for c in ("node", "pid") if c in host])  # a process is (node, pid)
    read = (g["read_bytes"].max() - g["read_bytes"].min()).sum()
    span = float(host["t_s"].max() - host["t_s"].min())
    return float(read) / span / 1e6 if span > 0 else None
