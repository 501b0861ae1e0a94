"""The terminal report, and the words and number formats that every report shares.

``render_text`` formats an :class:`~doctor.verdict.Analysis` for a terminal: the short summary that
``doctor run`` prints at the end, or (``full=True``) the ``doctor report --format text`` output.
It formats only; the findings, shares and speedups come from the rules.
"""

from __future__ import annotations

import contextlib
import math
import re
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

from doctor.analyse.analysis import Analysis
from doctor.reports.escape import escaped, shell_command, shell_word
from doctor.reports.verified import verified_line
from doctor.store.redact import redact_argv, redact_value
from doctor.units import human_bytes
from doctor.verdict import Finding, Verdict, fix_id

#: The bottleneck in words, for headlines.
BOTTLENECK_WORDS: dict[str, str] = {
    "io": "Input-bound: reading data (from storage or the network)",
    "decode": "Input-bound: decoding samples",
    "preprocess": "Input-bound: preprocessing (transforms, collation)",
    "input": "Input-bound: waiting for the DataLoader",
    "transfer": "Transfer-bound: host-to-device copies",
    "compute": "Compute-bound: forward, backward and optimizer",
    "communication": "Communication-bound: collectives not hidden behind compute",
    "unknown": "No verdict: the bottleneck could not be named",
}

#: What each category's time is, one line each (legends and tables).
CATEGORY_WORDS: dict[str, str] = {
    "io": "waiting for bytes from storage or network",
    "decode": "turning encoded bytes into arrays (images, video, audio)",
    "preprocess": "transforms, augmentation, tokenisation, collation",
    "input": "DataLoader wait that a trace alone cannot split",
    "transfer": "host-to-device copies and their waits",
    "compute": "forward, backward, optimizer",
    "communication": "collectives not hidden behind compute",
    "other": "everything else (logging, checkpoints, Python between steps)",
}

#: Job details shown first, in this order, with these labels; other keys follow as they are.
JOB_LABELS: dict[str, str] = {
    "argv": "command",
    "exit_code": "exit status",
    "device": "device",
    "ranks": "ranks",
    "parallelism": "parallelism",
    "host": "host",
    "cores": "cores",
    "torch_version": "torch",
    "python": "Python",
    "started": "started",
    "duration_s": "duration",
}

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


# --- shared formatting -----------------------------------------------------------------------


def headline(verdict: Verdict) -> str:
    """'Input-bound: decoding samples (83% of step time)'; for an input stage named as the
    largest of several, the whole pipeline's share with the stage's own beside it."""
    words = BOTTLENECK_WORDS.get(verdict.bottleneck, f"Bottleneck: {verdict.bottleneck}")
    share = verdict.shares.get(verdict.bottleneck)
    if share is None or not _is_number(share) or verdict.bottleneck == "unknown":
        return words
    whole = verdict.bottleneck_share
    if whole is not None and _is_number(whole) and float(whole) > float(share) + 0.005:
        return (f"{words} ({format_share(whole)} of step time in the input pipeline, "
                f"{format_share(share)} in this stage)")
    return f"{words} ({format_share(share)} of step time)"


def steps_line(verdict: Verdict) -> str:
    """'median step 91.0 ms, 70 of 80 steps analysed' (the parts that are known)."""
    steps = verdict.steps
    parts = []
    median = steps.get("median_s")
    if _is_number(median):
        parts.append(f"median step {format_seconds(median)}")
    analyzed, count = steps.get("analyzed"), steps.get("count")
    if _is_number(count) and _int(count) == 0:
        return "no steps recorded"
    if _is_number(analyzed) and _is_number(count):
        parts.append(f"{_int(analyzed)} of {_int(count)} steps analysed")
    elif _is_number(count):
        parts.append(f"{_int(count)} steps")
    skipped: Any = steps.get("skipped")
    micro: Any = steps.get("micro_batches")
    if _is_number(skipped) and _int(skipped) > 0:
        parts.append(f"{_int(skipped)} skipped by the GradScaler")
    if _is_number(micro) and float(micro) > 1:
        parts.append(f"{float(micro):g} micro-batches (backward() calls) a step")
    ranks = verdict.job.get("ranks")
    if _is_number(ranks) and _int(ranks) > 1:
        parts.append(f"{_int(ranks)} ranks")
    if isinstance(verdict.job.get("parallelism"), str) and verdict.job["parallelism"]:
        parts.append(verdict.job["parallelism"])
    return ", ".join(parts) if parts else "no steps recorded"


def partial_line(verdict: Verdict) -> str:
    """Why the figures are partial, for the banner."""
    code = verdict.job.get("exit_code")
    if _is_number(code) and _int(code) != 0:
        how = f"the job stopped with exit status {_int(code)}"
    elif code is None:
        how = "doctor did not see the job end (still running, crashed or interrupted)"
    else:  # it ended well: what is partial is what doctor could read of it
        return "PARTIAL: some of the run's records could not be read (see the notes)."
    return f"PARTIAL: {how}; the figures cover the steps recorded before it stopped."


def command_line(job: Mapping[str, Any]) -> str:
    """The job's command as a shell would take it, its secrets hidden (doctor.store.redact)."""
    argv = job.get("argv")
    if isinstance(argv, Sequence) and not isinstance(argv, str):  # escaped: a received run's
        return shell_command(redact_argv([str(a) for a in argv]))  # argv never acts on the terminal
    return escaped(redact_value(str(argv))) if argv else ""


def format_seconds(value: Any) -> str:
    if not _is_number(value):
        return "–"
    seconds = float(value)
    magnitude = abs(seconds)
    if magnitude >= 100:
        return f"{seconds:,.0f} s"
    if magnitude >= 1:
        return f"{seconds:.2f} s"
    if magnitude >= 1e-3 or magnitude == 0:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} µs"


def format_share(value: Any) -> str:
    if not _is_number(value):
        return "–"
    pct = float(value) * 100
    return f"{pct:.0f}%" if abs(pct) >= 10 else f"{pct:.1f}%"


def format_speedup(value: Any, approx: str = "≈") -> str:
    """'≈1.8x' (an estimate, hence the sign); '' when there is none."""
    if not _is_number(value):
        return ""
    return f"{approx}{float(value):.1f}x"


BYTE_UNITS = ("b", "kb", "mb", "gb")


def format_value(key: str, value: Any) -> str:
    """An evidence or table value, by the unit its name carries (``_s``, ``_pct``, ``share``)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if hasattr(value, "item") and callable(value.item) and not isinstance(value, str):
        with contextlib.suppress(TypeError, ValueError):
            value = value.item()
    if isinstance(value, bool):
        return "yes" if value else "no"
    name = key.lower().removesuffix("_per_step")  # comm_s_per_step: seconds
    if isinstance(value, int | float):
        if name.endswith("_per_s"):  # a rate: read_mb_per_s, samples_per_s
            unit = name.removesuffix("_per_s").rsplit("_", 1)[-1]
            return f"{value:.4g} {unit.upper() if unit in BYTE_UNITS else unit}/s"
        if name.endswith("_s") or name == "seconds":
            return format_seconds(value)
        if name.endswith("_pct") or name.endswith("percent"):
            return f"{float(value):.1f}%"
        if "share" in name or name.endswith("_frac") or name.endswith("fraction"):
            return format_share(value)
        if name.endswith("speedup"):
            return format_speedup(value)
        if name.endswith("bytes") and abs(value) >= 1024:
            return human_bytes(float(value), decimals=1)
        if isinstance(value, int):
            return f"{value:,}" if abs(value) >= 10_000 else str(value)
        return f"{value:.4g}"
    if isinstance(value, Mapping):  # each value by its own key's unit, else by this one's
        return "{" + ", ".join(f"{k}: {_nested(str(k), key, v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        items = ", ".join(format_value(key, v) for v in value)
        return f"[{items}]" if any(isinstance(v, Mapping) for v in value) else items
    return str(value)


def _nested(key: str, parent: str, value: Any) -> str:
    """A value of a mapping under ``parent``: by its own key's unit where that names one
    (``theory``, a rank's "0" do not), else by the parent's (``by_rank``, ``transfer_s``)."""
    own = format_value(key, value)
    return own if own != format_value("", value) else format_value(parent, value)


def _is_number(value: Any) -> bool:
    if isinstance(value, bool) or value is None:
        return False
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def _int(value: Any) -> int:
    return int(float(value))


def clean(text: str) -> str:
    """A string safe to print to a terminal: control characters (escape sequences) removed."""
    return _CONTROL.sub("", str(text))


# --- the terminal report ---------------------------------------------------------------------


def render_text(analysis: Analysis, *, width: int = 100, full: bool = False,
                report_path: str | None = None) -> str:
    """The terminal report.

    The summary (default) has the verdict, the shares, the top finding with its first fix, the
    probes that did not run, and where to go next. ``full=True`` (``--format text``) adds every
    finding with all its evidence and fixes, the notes and the job's details.
    ``report_path`` names the HTML report to point at, when one was written.
    """
    from doctor.reports.periods import period_line
    from doctor.reports.phases import phase_lines
    from doctor.reports.resource_lines import (
        comm_lines,
        gpu_lines,
        memory_lines,
        ops_lines,
        shard_lines,
    )
    from doctor.reports.slow_steps import slow_step_lines

    verdict = analysis.verdict
    width = max(width, 40)
    out: list[str] = []
    if verdict.partial:
        out += _wrap(partial_line(verdict), width)
    out.append(clean(f"doctor: {headline(verdict)}"))
    out.append(clean(f"  {steps_line(verdict)}"))
    periods = period_line(verdict)
    if periods:
        out.append(clean(f"  {periods}"))
    sections = analysis.sections
    out += [clean(f"  {line}") for line in gpu_lines(sections) + memory_lines(sections)
                                             + ops_lines(sections) + comm_lines(sections)
                                             + shard_lines(sections)
                                             + phase_lines(sections)
                                             + slow_step_lines(sections)]
    out += _share_bars(verdict, width)

    findings = verdict.findings
    if not findings:
        out.append("")
        out.append("No findings.")
    elif full:
        out.append("")
        out.append(f"Findings ({len(findings)}):")
        for finding in findings:
            out += _finding_lines(finding, width, all_fixes=True)
    else:
        out.append("")
        out.append("Top finding:")
        out += _finding_lines(findings[0], width, all_fixes=False)
        if len(findings) > 1:
            out.append(f"  (+{len(findings) - 1} more in the report)")

    off = {name: p for name, p in verdict.probes.items() if not p.ok}
    if off:
        out.append("")
        out.append("Probes that did not run:")
        said: dict[tuple[str, str], list[str]] = {}  # probes of one reason said once
        for name, probe in off.items():
            said.setdefault((probe.reason or "unavailable", probe.hint or ""), []).append(name)
        for (reason, hint), names in said.items():
            line = f"{', '.join(names)}: {reason}" + (f" (hint: {hint})" if hint else "")
            out += _wrap(line, width, "  ", "    ")

    if full:
        if verdict.notes:
            out.append("")
            out.append("Notes:")
            for note in verdict.notes:
                out += _wrap(note, width, "  - ", "    ")
        out.append("")
        out.append("Job:")
        for key, value in job_items(verdict.job):
            out += _wrap(f"{key}: {value}", width, "  ", "    ")
    elif verdict.notes:
        out.append("")
        for note in verdict.notes:
            out += _wrap(f"Note: {note}", width, "", "  ")

    out.append("")
    if report_path:
        out += _wrap(f"Report: {report_path}", width, "", "  ")
    elif analysis.source and not full:
        out += _wrap(f"Details: doctor report {shell_word(analysis.source)} --format text",
                     width, "", "  ")
    return "\n".join(clean(line) for line in out).rstrip() + "\n"


def _share_bars(verdict: Verdict, width: int) -> list[str]:
    shares = {k: float(v) for k, v in verdict.shares.items() if _is_number(v) and float(v) > 0}
    if not shares:
        return []
    label_w = max(len(k) for k in shares)
    bar_w = max(min(width - label_w - 14, 40), 10)
    top = max(shares.values())
    lines = []
    for cat, share in sorted(shares.items(), key=lambda kv: -kv[1]):
        if share < 0.005 and cat != verdict.bottleneck:
            continue
        filled = round(bar_w * share / top) if top > 0 else 0
        bar = "#" * filled + "." * (bar_w - filled)
        mark = " <" if cat == verdict.bottleneck else ""
        lines.append(f"  {cat:<{label_w}} {bar} {format_share(share):>5}{mark}")
    return lines


def _finding_lines(finding: Finding, width: int, *, all_fixes: bool) -> list[str]:
    speedup = format_speedup(finding.estimated_speedup, approx="~")
    title = f"[{finding.severity}] {finding.title}"
    if speedup:
        title += f" (est. {speedup} faster)"
    lines = _wrap(title, width, "  ", "    ")
    if all_fixes and finding.evidence:
        evidence = "; ".join(f"{k} = {format_value(k, v)}" for k, v in finding.evidence.items())
        lines += _wrap(f"evidence: {evidence}", width, "    ", "      ")
    fixes = finding.fixes if all_fixes else finding.fixes[:1]
    for n, fix in enumerate(fixes, 1):
        lines += _wrap(f"fix: {fix.title}", width, "    ", "      ")
        if fix.verified:
            lines += _wrap(verified_line(fix.verified), width, "      ", "        ")
        elif fix.apply is not None:
            lines.append(f"      measure it: doctor try --fix {fix_id(finding.id, n)}")
        if fix.why:
            lines += _wrap(fix.why, width, "      ", "      ")
        for code_line in fix.code.rstrip().splitlines():
            lines.append(f"        {code_line}")
    return lines


def job_items(job: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The job's details as (label, value): the known keys first, in order, then the rest."""
    items: list[tuple[str, str]] = []
    for key, label in JOB_LABELS.items():
        if key not in job:
            continue
        value = job[key]
        if key == "argv":
            if command_line(job):
                items.append((label, command_line(job)))
        elif key == "exit_code" and value is None:
            items.append((label, "none (the job did not finish)"))
        else:
            items.append((label, format_value(key, value)))
    items += [(str(k), format_value(str(k), v)) for k, v in job.items() if k not in JOB_LABELS]
    return items


def _wrap(text: str, width: int, first: str = "", rest: str = "") -> list[str]:
    return textwrap.wrap(clean(text), width=width, initial_indent=first, subsequent_indent=rest,
                         break_on_hyphens=False, break_long_words=False) or [first.rstrip()]
