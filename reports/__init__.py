"""The report renderers (text, HTML, verdict.json).

Importing the package points matplotlib at a writable folder where its own config or cache
folder is not (a read-only HOME, a container's): matplotlib would otherwise print two lines of
its own to stderr ("mkdir -p failed", "created a temporary cache directory"), in the middle of
doctor run's output.
"""

from __future__ import annotations

import os
import tempfile


def _writable(path: str) -> bool:
    """Whether ``path`` can be made and written: its nearest existing folder is writable."""
    while path and not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)


def _matplotlib_folder() -> None:
    if os.environ.get("MPLCONFIGDIR"):
        return
    home = os.path.expanduser("~")
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(home, ".cache")
    if not all(_writable(os.path.join(base, "matplotlib")) for base in (config, cache)):
        try:
            os.environ["MPLCONFIGDIR"] = tempfile.mkdtemp(prefix="doctor-matplotlib-")
        except OSError:  # no temporary folder either: matplotlib says what it says
            pass


_matplotlib_folder()
