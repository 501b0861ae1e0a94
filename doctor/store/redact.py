"""Secrets out of what doctor writes and shows: the job's command line and environment values.

What is hidden (the value only; the name stays, so the command still reads):

- the value of an option whose name looks secret, given as ``--name value`` or ``--name=value``
  (any case, ``-`` or ``_`` between words): ``--api-key``, ``--apikey``, ``--token``,
  ``--password``, ``--passwd``, ``--secret``, ``--key``, ``--auth``, ``--credentials``, and names
  that end in one of these words (``--hf-token``, ``--db_password``) or contain ``password``,
  ``passwd``, ``secret`` or ``credential``;
- the value of a ``NAME=value`` word (``HF_TOKEN=...``, ``db.password=...``) and of an
  environment variable whose name looks secret the same way (``*_KEY``, ``*_TOKEN``,
  ``*_SECRET``, ``*_PASSWORD``);
- the password of a URL with ``user:password@`` (``https://me:pw@host``, or
  ``MASTER_ADDR=me:pw@host`` without a scheme): the user and the host stay.

Each hidden value reads ``<redacted>``. Redacting twice changes nothing. A command with a
redacted word cannot be run again as recorded (``is_redacted``): doctor try says so.

This module runs inside the job's processes too: it imports nothing beyond the standard library.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["REDACTED", "is_redacted", "is_secret_name", "redact_argv", "redact_value"]

REDACTED = "<redacted>"

#: Names (their last word) whose value is a secret.
_SECRET_WORDS = frozenset({"key", "apikey", "token", "password", "passwd", "secret",
                           "auth", "credentials", "credential"})
#: Words that make a name secret wherever they are in it.
_SECRET_PARTS = ("password", "passwd", "secret", "credential", "apikey", "api-key",
                 "private-key", "access-key")
#: Words before "key" or "token" that name a model's or a dataset's setting, not a secret
#: (``--pad-token "<pad>"``, ``--sort-key length``): their values stay, so doctor try can run
#: the command again.
_ML_WORDS = frozenset({
    "pad", "eos", "bos", "unk", "cls", "sep", "mask", "special", "start", "end", "stop",
    "sort", "max", "min", "num", "dataset", "text", "label", "column", "input", "output", "image",
    "audio", "target", "group", "partition", "primary", "cache", "hash", "shard", "sample",
    "feature", "metric", "monitor", "vocab", "prompt", "sequence", "split", "batch"})
#: ``user:password@`` in a URL (any scheme), or at the start of a value without one
#: (``user:pw@host``); the password is group ``pw``.
_URL_CREDENTIALS = re.compile(
    r"(?P<head>(?:[A-Za-z][A-Za-z0-9+.-]*://|^|(?<=[=\s,;]))[^\s:/@?#]+:)"
    r"(?P<pw>[^\s@/?#]+)(?=@)")
_NAME_VALUE = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)=(?P<value>.*)$", re.DOTALL)


def is_secret_name(name: str) -> bool:
    """Whether an option's or a variable's name says its value is a secret (``--api-key``,
    ``HF_TOKEN``, ``db.password``; not ``--max-tokens`` or ``TOKENIZERS_PARALLELISM``)."""
    spelled = name.lstrip("-").lower().replace("_", "-").replace(".", "-")
    if not spelled:
        return False
    words = spelled.split("-")
    if words[-1] in ("key", "token") and len(words) > 1 and words[-2] in _ML_WORDS:
        return any(part in spelled for part in _SECRET_PARTS)  # --pad-token, --sort-key
    return words[-1] in _SECRET_WORDS or any(part in spelled for part in _SECRET_PARTS)


def redact_value(value: str) -> str:
    """``value`` with the password of each ``user:password@`` hidden; a ``NAME=value`` word
    whose name looks secret with its value hidden."""
    found = _NAME_VALUE.match(value)
    if found and is_secret_name(found["name"]) and found["value"] != REDACTED:
        return f"{found['name']}={REDACTED}"
    return _URL_CREDENTIALS.sub(lambda m: m["head"] + REDACTED, value)


def redact_argv(argv: Iterable[str]) -> list[str]:
    """A command line with the values of secret-looking options, ``NAME=value`` words and
    URL passwords hidden (the words themselves kept, one for one)."""
    out: list[str] = []
    hide_next = False
    for word in (str(w) for w in argv):
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        if word.startswith("--") and len(word) > 2:
            name, eq, _value = word.partition("=")
            if is_secret_name(name):
                if eq:
                    out.append(f"{name}={REDACTED}")
                else:
                    out.append(word)
                    hide_next = True
                continue
        out.append(redact_value(word))
    return out


def is_redacted(words: Iterable[str]) -> bool:
    """Whether any of ``words`` had a secret hidden (so that it cannot be run as recorded)."""
    return any(REDACTED in str(w) for w in words)
