"""torch.compile's own cost (doctor.analyse.compiles): recompilations, each a compile again
(a new input shape, a changed guard; a frame compiled RECOMPILE_LIMIT times runs eagerly from
then on), and the first compilation against a run short enough to feel it.
"""

from __future__ import annotations

from doctor.analyse.compiles import RECOMPILE_LIMIT, Compiles
from doctor.analyse.evidence import Evidence
from doctor.rules.base import rule
from doctor.verdict import Finding, Fix

RECOMPILE_SHARE = 0.05  # recompilations taking this share of the run or more get a word
MIN_RECOMPILES = 2
FIRST_SHARE = 0.10  # a first compilation of this share of the run or more gets a word

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
    return [Finding(
        id="compile.recompiles", category="compute",
        severity="critical" if share >= 0.25 else "warning",
        title=f"torch.compile recompiled {worst.recompilations} times (frame {frame}: "
              f"{times}), {worst.recompile_s:.1f} s, {share:.0%} of the run{limit}",
        evidence=_evidence(worst), fixes=(DYNAMIC, BUCKETS, WHY),
        estimated_speedup=1.0 / max(1e-9, 1.0 - share))]


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
        evidence=_evidence(worst), fixes=(CACHES,))]


def _evidence(c: Compiles) -> dict[str, object]:
    frame, times = c.most_recompiled
    return {"rank": c.rank, "compilations": c.compilations,
            "recompilations": c.recompilations, "first_compile_s": c.first_s,
            "recompile_s": c.recompile_s, "recompile_share": c.recompile_share,
            "first_compile_share": c.first_share, "steps_compiling": c.steps_compiling,
            "most_recompiled_frame": frame, "its_recompilations": times}
