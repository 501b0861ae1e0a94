"""Turn what the user typed after ``doctor run`` into the argv of a Python process.

``train.py ARGS`` -> ``python train.py ARGS``; ``python train.py``, ``python -m pkg.mod`` and
Python console scripts such as ``torchrun`` run as typed. Anything else is refused with a
one-line reason, since doctor can only instrument Python.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from doctor.errors import UsageError

_PYTHON_NAME = re.compile(r"^python(\d+(\.\d+)?)?$")


@dataclass(frozen=True)
class JobCommand:
    argv: list[str]
    name: str  # short name for the run directory, e.g. "train"


def resolve_command(words: list[str] | tuple[str, ...]) -> JobCommand:
    words = list(words)
    if not words:
        raise UsageError("no command given: try `doctor run train.py` or "
                         "`doctor run python -m pkg.train`")
    first = words[0]
    if first.endswith(".py"):
        _require_script(first)
        return JobCommand([sys.executable, *words], Path(first).stem)
    exe = shutil.which(first)
    if exe is None:
        raise UsageError(f"command not found: {first}")
    if _PYTHON_NAME.match(Path(first).name) or _is_python_binary(exe):
        return JobCommand(words, _python_job_name(words[1:]))
    if _is_python_script(exe):
        rest = [w for w in words[1:] if not w.startswith("-")]
        scripts = [w for w in rest if w.endswith(".py")]
        return JobCommand(words, Path(scripts[0]).stem if scripts else Path(first).name)
    raise UsageError(f"{first} is not a Python command: doctor instruments Python jobs "
                     "(train.py, python ..., python -m ..., torchrun ...)")


def _python_job_name(args: list[str]) -> str:
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "-m" and i + 1 < len(args):
            return args[i + 1].rsplit(".", 1)[-1]
        if arg in ("-c",):
            return "python-c"
        if arg in ("-W", "-X", "-Q"):
            i += 2
            continue
        if arg.startswith("-"):
            i += 1
            continue
        _require_script(arg)
        return Path(arg).stem
    raise UsageError("python needs a script or -m module to profile")


#: Python's options that keep doctor's bootstrap out (it loads as ``sitecustomize`` from a
#: folder put first on PYTHONPATH): what each does.
BOOTSTRAP_BLOCKERS = {
    "I": "-I (isolated mode) ignores PYTHONPATH and skips the user's site",
    "E": "-E ignores PYTHONPATH (and every PYTHON* variable)",
    "S": "-S skips the site module, which loads sitecustomize",
}
_TAKES_VALUE = frozenset("WXQ")


def bootstrap_blockers(argv: list[str] | tuple[str, ...]) -> list[str]:
    """Which of Python's options in a ``python ...`` command keep doctor's bootstrap from
    loading (BOOTSTRAP_BLOCKERS' words), in the order given; [] for any other command."""
    if not argv or not _PYTHON_NAME.match(Path(argv[0]).name):
        return []
    found: list[str] = []
    args = list(argv[1:])
    while args:
        arg = args.pop(0)
        if not arg.startswith("-") or arg.startswith("--") or arg == "-":
            break  # the script (or stdin): Python's own options end here
        for k, letter in enumerate(arg[1:], start=2):
            if letter in BOOTSTRAP_BLOCKERS and BOOTSTRAP_BLOCKERS[letter] not in found:
                found.append(BOOTSTRAP_BLOCKERS[letter])
            if letter in "mc":
                return found  # a module or a command: what follows is the job's
            if letter in _TAKES_VALUE:
                if k == len(arg):  # -W ignore, -X dev: the value is the next word
                    args = args[1:]
                break  # -Wignore: the rest of the word is the value
    return found


def _require_script(path: str) -> None:
    if not Path(path).is_file():
        raise UsageError(f"no such script: {path}")


def _is_python_binary(exe: str) -> bool:
    real = os.path.realpath(exe)
    return _PYTHON_NAME.match(Path(real).name) is not None


def _is_python_script(exe: str) -> bool:
    """A console script (torchrun, accelerate, ...) whose shebang runs Python."""
    try:
        with open(exe, "rb") as f:
            head = f.readline(256)
    except OSError:
        return False
    return head.startswith(b"#!") and b"python" in head
