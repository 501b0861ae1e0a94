"""``doctor try``: apply a fix without code, re-run a few steps, measure the speedup.

plan (what to try) -> attempt (one stopped run of the job) -> measure (speedups, outcomes)
-> runner (the rounds, try.json)."""
