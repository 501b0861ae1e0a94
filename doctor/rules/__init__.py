"""Rules: importing this package registers every rule (see doctor.rules.base)."""

from __future__ import annotations

from doctor.rules import compute, distributed, gpu, host, input, other  # noqa: F401  (registration)
