"""torch.compile's own cost (doctor.analyse.compiles): recompilations, each a compile again
(a new input shape, a changed guard; a frame compiled RECOMPILE_LIMIT times runs eagerly from
then on) with the guard that failed and the fix that fits it, the first compilation against a
run short enough to feel it, and the graph breaks with the line of the job's code to change.
"""

from __future__ import annotations

from doctor.analyse.compile_causes import GraphBreak, RecompileCause
from doctor.analyse.compiles import RECOMPILE_LIMIT, Compiles
from doctor.analyse.evidence import Evidence
from doctor.rules.base import rule
from doctor.verdict import Finding, Fix

RECOMPILE_SHARE = 0.05  # recompilations taking this share of the run or more get a word
MIN_RECOMPILES = 2
FIRST_SHARE = 0.10  # a first compilation of this share of the run or more gets a word
MANY_BREAKS = 3  # distinct graph breaks from which they are a warning, not only said
EAGER_SHARE = 0.25  # op time outside compiled graphs from which breaks are a warning too
TOP_BREAKS = 3  # breaks named in a finding

DYNAMIC = Fix(
    title="Compile for the shapes that vary",
    why="Dynamo specialises on each input shape it meets and compiles again for a new one; "
        "marked dynamic, one compiled graph serves every length",
    code="model = torch.compile(model, dynamic=True)\n"
         "# or only the dimension that varies, before the call:\n"
         "torch._dynamo.mark_dynamic(x, 1)")
BUCKETS = Fix(
    title="Pad the inputs to a few fixed lengths",
    why="a handful of lengths (buckets) compiles a handful of times, once each",
    code="length = min(b for b in (64, 128, 256, 512) if b >= x.shape[1])\n"
         "x = torch.nn.functional.pad(x, (0, length - x.shape[1]))")
WHY = Fix(
    title="See why it recompiles",
    why="Dynamo logs each recompilation with the guard that failed",
    code="TORCH_LOGS=recompiles python train.py")
DTYPE = Fix(
    title="Give the compiled code one dtype",
    why="Dynamo guards on each input's dtype and compiles again for a new one; cast the "
        "inputs once, before the compiled call",
    code="x = x.to(torch.float32)  # the one dtype the compiled model sees\n"
         "out = model(x)")
VALUE = Fix(
    title="Pass the changing number as a tensor, or keep it constant",
    why="Dynamo bakes a Python number the code reads into the graph and guards on it: each "
        "new value compiles again; a tensor's value is data, not a guard",
    code="scale = torch.tensor(scale)  # was a Python float that changes every step\n"
         "out = model(x, scale)")
EAGER = Fix(
    title="Measure the job uncompiled: is compiling worth it here?",
    why="doctor try runs the job with torch.compile handing back the model unchanged: its "
        "steady steps eager against compiled, where the compile time (first and again) is "
        "gone; keep torch.compile where it wins by more than its compile time over the run",
    code="doctor try --set compile=off",
    apply={"torch": {"compile": "off"}})
#: the fixes that fit each kind of failed guard (doctor.analyse.compile_causes.KINDS)
FIXES_BY_KIND = {"size": (DYNAMIC, BUCKETS), "dtype": (DTYPE,), "value": (VALUE,)}
CACHES = Fix(
    title="Keep the compiled artifacts between runs",
    why="every new process compiles again; the compile caches (on by default for Inductor's "
        "graphs) and the saved cache artifacts make the next start faster",
    code="artifacts = torch.compiler.save_cache_artifacts()  # after the first steps\n"
         "# next run, before compiling:\n"
         "torch.compiler.load_cache_artifacts(artifacts[0])")


@rule("compile.recompiles", needs=("compiles",))
def recompiles(ev: Evidence) -> list[Finding]:
    assert ev.compiles is not None  # guaranteed by needs
    worst = max(ev.compiles.values(), key=lambda c: c.recompile_s)
    share = worst.recompile_share
    if worst.recompilations < MIN_RECOMPILES or share < RECOMPILE_SHARE:
        return []
    frame, times = worst.most_recompiled
    limit = (f"; frame {frame} reached Dynamo's recompile limit ({RECOMPILE_LIMIT}): it runs "
             "eagerly from then on" if worst.at_limit else "")
    because = f": {_cause_words(worst.causes[0])}" if worst.causes else ""
    return [Finding(
        id="compile.recompiles", category="compute",
        severity="critical" if share >= 0.25 else "warning",
        title=f"torch.compile recompiled {worst.recompilations} times (frame {frame}: "
              f"{times}), {worst.recompile_s:.1f} s, {share:.0%} of the run{limit}{because}",
        evidence=_evidence(worst), fixes=(*_fixes_for(worst.causes), EAGER),
        estimated_speedup=1.0 / max(1e-9, 1.0 - share))]


def _cause_words(cause: RecompileCause) -> str:
    seconds = f", {cause.seconds:.1f} s" if cause.seconds > 0 else ""
    if cause.refused:
        seconds += f", {cause.refused} more past the limit: eager"
    return (f"{cause.words} ({cause.count}x{seconds}; {cause.function} at "
            f"{cause.file}:{cause.line}: {cause.example})")


def _fixes_for(causes: tuple[RecompileCause, ...]) -> tuple[Fix, ...]:
    """The fixes of the causes' kinds, the costliest cause's first; the way to see the guards
    where a cause has no fix of its own (or none was recorded)."""
    fixes: list[Fix] = []
    for cause in causes:
        fixes += [f for f in FIXES_BY_KIND.get(cause.kind, ()) if f not in fixes]
    if not causes or any(c.kind not in FIXES_BY_KIND for c in causes):
        fixes.append(WHY)
    return tuple(fixes)


@rule("compile.graph_breaks", needs=("compiles",))
def graph_breaks(ev: Evidence) -> list[Finding]:
    assert ev.compiles is not None  # guaranteed by needs
    worst = max(ev.compiles.values(), key=lambda c: len(c.breaks))
    if not worst.breaks:
        return []
    top = worst.breaks[:TOP_BREAKS]
    first = top[0]
    ops = (ev.ops or {}).get(worst.rank)
    compiled = ops.compiled_share if ops is not None else None
    eager = 1.0 - compiled if compiled is not None else None
    costly = len(worst.breaks) >= MANY_BREAKS or (eager is not None and eager >= EAGER_SHARE)
    outside = (f"; {eager:.0%} of the op time in the profiled steps ran outside the compiled "
               "graphs" if eager is not None else "")
    return [Finding(
        id="compile.graph_breaks", category="compute", severity="warning" if costly else "info",
        title=f"torch.compile broke the graph at {len(worst.breaks)} place(s) in the job's code "
              f"(each break runs eagerly between compiled graphs): {first.reason} at "
              f"{first.where}{outside}",
        evidence={"rank": worst.rank, "graph_breaks": len(worst.breaks),
                  "breaks": [{"reason": b.reason, "where": b.where, "times_met": b.count}
                             for b in worst.breaks[:10]],
                  "eager_share_of_ops": eager},
        fixes=tuple(_break_fix(b) for b in top))]


def _break_fix(b: GraphBreak) -> Fix:
    return Fix(
        title=f"Change {b.where} ({b.reason})",
        why="Dynamo cannot trace this line: it ends one graph there and starts another after "
            "it, the line and the glue around it run eagerly. Branchless tensor code "
            "(torch.where, clamp), torch.cond, or moving it out of the compiled function keeps "
            "one graph",
        code=f"# {b.where}: {b.reason}\n"
             "TORCH_LOGS=graph_breaks python train.py  # the full reason and traceback")


@rule("compile.first", needs=("compiles",))
def first_compile(ev: Evidence) -> list[Finding]:
    assert ev.compiles is not None  # guaranteed by needs
    worst = max(ev.compiles.values(), key=lambda c: c.first_s)
    if worst.first_share < FIRST_SHARE:
        return []
    return [Finding(
        id="compile.first", category="compute", severity="info",
        title=f"torch.compile compiled for {worst.first_s:.1f} s before the steps ran steady: "
              f"{worst.first_share:.0%} of this run, paid again by every new process",
        evidence=_evidence(worst), fixes=(CACHES, EAGER))]


def _evidence(c: Compiles) -> dict[str, object]:
    frame, times = c.most_recompiled
    return {"rank": c.rank, "compilations": c.compilations,
            "recompilations": c.recompilations, "first_compile_s": c.first_s,
            "recompile_s": c.recompile_s, "recompile_share": c.recompile_share,
            "first_compile_share": c.first_share, "steps_compiling": c.steps_compiling,
            "most_recompiled_frame": frame, "its_recompilations": times,
            "causes": [{"kind": k.kind, "recompilations": k.count, "refused": k.refused,
                        "seconds": k.seconds,
                        "guard": k.example, "function": k.function,
                        "where": f"{k.file}:{k.line}"} for k in c.causes],
            "graph_breaks": len(c.breaks)}
