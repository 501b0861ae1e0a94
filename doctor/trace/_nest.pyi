"""Types of doctor/trace/_nest.c: how the host ops of a trace nest."""

from typing import Any

def self_times(start: Any, end: Any, tid: Any, own: Any) -> bool: ...
def launching_ops(h_start: Any, h_end: Any, h_tid: Any, r_start: Any, r_tid: Any,
                  out: Any) -> bool: ...
