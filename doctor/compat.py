"""The environment doctor was installed into, checked once as ``doctor run`` starts: a torch
built for NumPy 1.x beside a NumPy 2.x.

torch before 2.3 was built against NumPy 1.x; beside NumPy 2 its NumPy bridge fails ("Numpy is
not available": ``torch.from_numpy``, a DataLoader collating numpy arrays). torch does not
declare NumPy, so pip cannot know: installing doctor into such an environment lets pip choose
the newest pandas, and pandas 3.1 requires NumPy 2. Installing with ``"numpy<2"`` beside doctor
makes pip choose a pandas that works with NumPy 1.x instead (the README says so); this check
says it in one line to whoever did not, before their job fails for it.
"""

from __future__ import annotations

import re
from importlib import metadata

FIRST_TORCH_FOR_NUMPY2 = (2, 3)


def _version(dist: str) -> tuple[int, int] | None:
    try:
        found = re.match(r"(\d+)\.(\d+)", metadata.version(dist))
    except (metadata.PackageNotFoundError, ValueError, TypeError):
        return None
    return (int(found[1]), int(found[2])) if found else None


def numpy_mismatch(torch: tuple[int, int] | None = None,
                   numpy: tuple[int, int] | None = None) -> str | None:
    """One line when the installed torch predates NumPy 2 support and NumPy 2 is installed;
    None otherwise (or when either is not installed)."""
    torch = torch or _version("torch")
    numpy = numpy or _version("numpy")
    if torch is None or numpy is None or torch >= FIRST_TORCH_FOR_NUMPY2 or numpy[0] < 2:
        return None
    return (f"doctor: torch {torch[0]}.{torch[1]} was built for NumPy 1.x but NumPy "
            f"{numpy[0]}.{numpy[1]} is installed here (torch's NumPy bridge fails beside it): "
            "pip install \"numpy<2\" \"pandas<3.1\" puts back versions that work with it")
