"""In the job: when to look again. After the first deep window, a drift detector watches the
steady step time and says when a later window should open (doctor.probes.torch_ops opens it).

It is fed the Session's clock at each counted step boundary (``step(now_ns)``: a subtraction, a
store, a counter; every BLOCK steps a sort of BLOCK numbers), and never allocates on the way.

- **Baseline**: after a window closes, SETTLE steps are left alone (the steps a window leaves
  behind), then BASELINE_BLOCKS blocks of BLOCK steps give the baseline: their median step, and
  their mean (which holds the spikes the job had then).
- **Drift**: a block is slow when its median step is at least RISE times the baseline's median
  (the steady step slowed down), or its mean at least RISE times the baseline's mean (the spikes
  changed: more of them, or longer). A stretch of slow blocks in a row of ``sustain`` steps
  (SUSTAIN_FRACTION of the steps so far, between SUSTAIN_MIN and SUSTAIN_MAX) is a drift; one
  spike, or a few slow blocks, is not.
- **Budget**: a drift opens a window only where MIN_GAP_S have passed since the last window closed,
  and the later windows' cost so far, with this one's (estimated by the dearest window measured),
  stays within BUDGET of the run's time so far. A window's cost is measured: the time from its
  opening to the end of its export, less its steps at the pace before it; then the steps while
  its stacks are sampled (``span_ns`` from its opening), over that pace.
  A drift the budget holds back opens its window later, if it lasts. A sustained speed-up (the
  blocks' median RISE times faster) is no drift: it only makes a new baseline, so that a later
  slow-down is measured from the new pace.

``DOCTOR_REWINDOW``: ``off`` turns later windows off (``doctor run --rewindow off``); otherwise
``KEY=VALUE`` pairs, comma-separated, change the constants (``gap=0,sustain=20``: for tests and
benches). A value that does not parse is ignored: this runs inside the job and never raises.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

ENV_REWINDOW = "DOCTOR_REWINDOW"

BLOCK = 16  # steps per block: the detector judges blocks, not single steps
SETTLE = 8  # steps after a window left out of the baseline
BASELINE_BLOCKS = 3
RISE = 1.2  # a block this much slower than the baseline is slow
SUSTAIN_MIN = 48  # steps of slow blocks in a row that make a drift ...
SUSTAIN_MAX = 512
SUSTAIN_FRACTION = 0.1  # ... or this part of the steps so far, between the two
MIN_GAP_S = 600.0  # between the end of one window and the start of the next
BUDGET = 0.01  # the later windows together, of the run's time so far
MAX_WINDOWS = 8  # later windows per process, whatever the budget says


@dataclass(frozen=True)
class Settings:
    """The detector's constants (``DOCTOR_REWINDOW`` changes them; see the module docstring)."""

    on: bool = True
    block: int = BLOCK
    settle: int = SETTLE
    baseline_blocks: int = BASELINE_BLOCKS
    rise: float = RISE
    sustain_min: int = SUSTAIN_MIN
    sustain_max: int = SUSTAIN_MAX
    sustain_fraction: float = SUSTAIN_FRACTION
    gap: float = MIN_GAP_S
    budget: float = BUDGET
    max_windows: int = MAX_WINDOWS


OFF = Settings(on=False)


def settings_of(environ: Mapping[str, str]) -> Settings:
    """The settings ``DOCTOR_REWINDOW`` asks for (the defaults where it is unset, or for each
    pair that does not parse); never raises."""
    text = environ.get(ENV_REWINDOW, "").strip().lower()
    if text in ("off", "0", "no", "false"):
        return OFF
    found = Settings()
    kinds = {f.name: type(getattr(found, f.name)) for f in fields(Settings) if f.name != "on"}
    for pair in text.split(","):
        key, _, value = pair.partition("=")
        kind = kinds.get(key.strip())
        if kind is None:
            continue
        try:
            number = kind(float(value)) if kind is int else kind(value)
        except ValueError:
            continue
        if number >= 0:
            found = replace(found, **{key.strip(): number})
    return found


class DriftDetector:
    """Says when a later window should open; see the module docstring. All times in ns of the
    Session's clock."""

    def __init__(self, settings: Settings, started_ns: int) -> None:
        self.s = settings
        self.started_ns = started_ns  # the run's start (the budget is a part of the time since)
        self.block = max(2, settings.block)
        self._times = [0.0] * self.block
        self._n = 0  # steps in the block being filled
        self._last = 0  # the last boundary's time (0: none yet)
        self._settle = settings.settle
        self._baseline: list[float] = []
        self.base_median = 0.0
        self.base_mean = 0.0
        self.last_median = 0.0  # the last block's median step: the pace a window opened at
        self.slow_steps = 0  # steps of slow blocks in a row
        self.fast_steps = 0  # steps of fast blocks in a row (a sustained speed-up: rebaseline)
        self.steps = 0  # counted steps seen (the "steps so far" of the sustain)
        self.spent_ns = 0  # the later windows' measured cost
        self.dearest_ns = 0  # the dearest window's measured cost (the next one's estimate)
        self.closed_ns = 0  # when the last window closed
        self.opened = 0  # later windows opened
        # the stack sampling beside the last window: until when, the pace before it, the
        # steps' time over that pace so far, whether the window was a later one, its own cost
        self._span_until = 0
        self._span_pace = 0.0
        self._span_excess = 0.0
        self._span_later = False
        self._last_cost = 0

    def step(self, now: int) -> bool:
        """A counted step boundary at ``now``: True when a later window should open now."""
        last, self._last = self._last, now
        self.steps += 1
        if last == 0:
            return False
        if self._span_until:
            self._sampling(now, now - last)
        if self._settle > 0:
            self._settle -= 1
            return False
        self._times[self._n] = now - last
        self._n += 1
        if self._n < self.block:
            return False
        self._n = 0
        return self._judge()

    def _judge(self) -> bool:
        """A block is full: baseline it, or judge it."""
        times = sorted(self._times)
        median = times[len(times) // 2]
        mean = sum(times) / len(times)
        self.last_median = median
        if len(self._baseline) < 2 * max(1, self.s.baseline_blocks):
            self._baseline += [median, mean]
            if len(self._baseline) >= 2 * max(1, self.s.baseline_blocks):
                medians, means = self._baseline[0::2], self._baseline[1::2]
                self.base_median = sorted(medians)[len(medians) // 2]
                self.base_mean = sum(means) / len(means)
            return False
        rise = self.s.rise
        sustain = min(max(self.s.sustain_fraction * self.steps, self.s.sustain_min),
                      self.s.sustain_max)
        if median * rise <= self.base_median:  # faster: a new baseline, if it lasts
            self.fast_steps += self.block
            self.slow_steps = 0
            if self.fast_steps >= sustain:
                self._baseline = []
                self.fast_steps = 0
            return False
        self.fast_steps = 0
        if median >= rise * self.base_median or mean >= rise * self.base_mean:
            self.slow_steps += self.block
        else:
            self.slow_steps = 0
            return False
        return self.slow_steps >= sustain and self.allowed(self._last)

    def allowed(self, now: int) -> bool:
        """Whether the gap and the budget let a window open at ``now``."""
        if self.opened >= self.s.max_windows:
            return False
        if self.closed_ns and now - self.closed_ns < self.s.gap * 1e9:
            return False
        return self.spent_ns + self.dearest_ns <= self.s.budget * (now - self.started_ns)

    def _sampling(self, now: int, step_ns: int) -> None:
        """A step while the stacks beside the last window are sampled: its time over the pace
        before the window is the sampler's; once the span is over, that is the window's cost
        too."""
        if now < self._span_until:
            self._span_excess += step_ns - self._span_pace
            return
        self._span_until = 0
        cost = max(0, round(self._span_excess))
        if self._span_later:
            self.spent_ns += cost
        self.dearest_ns = max(self.dearest_ns, self._last_cost + cost)

    def window_done(self, opened_ns: int, closed_ns: int, steps: int, later: bool,
                    step_ns: float | None = None, span_ns: int = 0) -> int:
        """A window ran from ``opened_ns`` to ``closed_ns`` (its export done) over ``steps``
        steps: its cost (ns), the time less its steps at the usual step (``step_ns``, else the
        pace of the block it opened after), is measured, and the detector starts over (a new
        baseline). The first window's cost (``later`` False) is only the estimate of the next
        ones'."""
        usual = self.last_median if step_ns is None else step_ns
        cost = max(0, round(closed_ns - opened_ns - steps * usual))
        if later:
            self.spent_ns += cost
            self.opened += 1
        self.dearest_ns = max(self.dearest_ns, cost)
        self.closed_ns = closed_ns
        self._restart()
        if span_ns > 0 and usual > 0:  # then the stack sampling's steps, as they come
            self._span_until, self._span_pace = opened_ns + span_ns, usual
            self._span_excess, self._span_later, self._last_cost = 0.0, later, cost
        return cost

    def _restart(self) -> None:
        self._n = 0
        self._last = 0
        self._settle = self.s.settle
        self._baseline = []
        self.slow_steps = self.fast_steps = 0
