"""Text from a run directory, shown on a terminal without letting it act on the terminal.

A received run directory's run.json says what ``doctor try`` will run; its argv may hold escape
sequences that, printed as they are, would draw a made-up command over the real one right above
the [y/N] prompt. Every character that is not printable (C0 and C1 controls, ESC, CR, BEL, DEL,
the bidirectional overrides U+202A-U+202E and U+2066-U+2069, other format characters, lone
surrogates from bytes that were not UTF-8) is shown escaped: a word that holds one is written in
bash's ``$'...'`` quoting (``$'\\x1b[2K'``), which is also what a shell would need to run it; any
other word as ``shlex.quote`` writes it.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable

__all__ = ["escaped", "shell_command", "shell_word"]

_ESCAPED_BYTES = range(0xDC80, 0xDD00)  # os.fsdecode's surrogateescape of bytes 0x80-0xff
_SHORT = {"\a": "\\a", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\v": "\\v", "\f": "\\f",
          "\r": "\\r"}


def _hidden(c: str) -> bool:
    return not c.isprintable() and c != " "


def _code(c: str) -> str:
    n = ord(c)
    if n in _ESCAPED_BYTES:
        return f"\\x{n - 0xDC00:02x}"
    if c in _SHORT:
        return _SHORT[c]
    if n < 0x80:  # (above, \xNN would be a byte to a shell, not the character)
        return f"\\x{n:02x}"
    return f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def escaped(text: str) -> str:
    """``text`` with each character that is not printable as its escape (``\\x1b``, ``\\u202e``);
    a backslash is doubled only where something was escaped, so plain text reads as it is."""
    if not any(_hidden(c) for c in text):
        return text
    return "".join(_code(c) if _hidden(c) else "\\\\" if c == "\\" else c for c in text)


def shell_word(word: str) -> str:
    """One argument as a shell would need it typed, never with a character that is not
    printable."""
    if not any(_hidden(c) for c in word):
        return shlex.quote(word)
    body = "".join(_code(c) if _hidden(c) else "\\\\" if c == "\\" else "\\'" if c == "'"
                   else c for c in word)
    return f"$'{body}'"


def shell_command(argv: Iterable[str]) -> str:
    """A command line as a shell would need it typed, safe to print on a terminal."""
    return " ".join(shell_word(str(a)) for a in argv)
