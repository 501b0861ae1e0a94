"""The parent's per-tick sample tables stay bounded over a long run (doctor.probes.tick_tables):
whole ticks are thinned, never a process of a tick, and the run's first minutes keep their
full rate."""

from __future__ import annotations

import numpy as np

from doctor.probes.tick_tables import TickTable


def fill(table: TickTable, ticks: int, per_tick: int, interval_s: float = 0.5) -> None:
    for k in range(ticks):
        for pid in range(per_tick):
            table.add((k * interval_s, 1000 + pid, float(k)))


def test_a_day_of_ticks_stays_under_the_bound_with_every_tick_whole() -> None:
    table = TickTable(("t_s", "pid", "cpu_s"), max_rows=2000, head_s=60.0)
    fill(table, 24 * 3600 * 2, per_tick=2)  # a day at 2 Hz, two processes (an even count)
    t = np.frombuffer(table.columns["t_s"])
    pid = np.frombuffer(table.columns["pid"])
    assert len(t) <= 2000 + 2
    assert table.thinned > 0
    _, counts = np.unique(t, return_counts=True)
    assert (counts == 2).all()  # each tick kept whole: both processes, to the end
    assert set(pid[t > 3600]) == {1000, 1001}
    assert t.max() >= 24 * 3600 - 60  # the newest ticks are there
    head = t[t < 60.0]
    assert len(np.unique(head)) == 120  # the first minute at the full 2 Hz
    assert (np.diff(t[t >= 60.0]) >= 0).all()  # still in time order


def test_a_short_run_is_kept_as_it_was_sampled() -> None:
    table = TickTable(("t_s", "pid", "cpu_s"), max_rows=2000)
    fill(table, 100, per_tick=3)
    assert len(table) == 300 and table.thinned == 0
