"""What the reports format (Analysis): the verdict, the ledger behind it, and where it came from."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from doctor.verdict import Verdict


@dataclass
class Analysis:
    """What the reports format: the verdict, the ledger behind it, and where it came from.

    ``ledger`` has LEDGER_COLUMNS (seconds; ``start_s`` from the run's start; ``warmup`` and
    ``analyzed`` are booleans) and may be empty. ``source`` is the run directory or the traces.
    """

    verdict: Verdict
    ledger: pd.DataFrame
    source: str
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
