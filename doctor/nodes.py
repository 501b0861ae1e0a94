"""Which node of a multi-node job a ``doctor run`` is: its node rank and the number of nodes,
from the job's command and the environment, or None for a single-node job.

Each of the two values is taken from the first of these sources that gives a valid one:

1. ``DOCTOR_NODE_RANK``, ``DOCTOR_NNODES``: set by the user, they win;
2. torchrun's own arguments (``--nnodes N`` or ``MIN:MAX``, ``--node-rank K``, either spelling,
   with a space or ``=``; or ``PET_NNODES``, ``PET_NODE_RANK``, which torchrun reads in their
   stead). A torchrun given no number of nodes runs one node, whatever the scheduler says;
3. SLURM: ``SLURM_NODEID`` of ``SLURM_STEP_NUM_NODES``, ``SLURM_JOB_NUM_NODES`` or
   ``SLURM_NNODES`` (the step's count first: ``srun -N1`` inside a larger allocation is one node);
4. Open MPI, one doctor per node: ``OMPI_COMM_WORLD_RANK`` of ``OMPI_COMM_WORLD_SIZE``;
5. PMI (MPICH, Intel MPI): ``PMI_RANK`` of ``PMI_SIZE``.

A value that is not a whole number in range (a rank below 0, a count below 1, ``MIN:MAX`` with
MIN above MAX) is ignored, as if unset. An elastic ``--nnodes MIN:MAX`` counts MAX nodes. One node,
or no count at all, is a single-node job. A job of several nodes whose rank cannot be told, or
whose rank is not below the count, is a UsageError that says what to set.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from doctor.errors import UsageError

#: The launcher modules that take torchrun's arguments (``python -m torch.distributed.run``).
TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")
#: torchrun's options that take no value (``_`` spelled ``-``); every other option takes one.
_TORCHRUN_FLAGS = frozenset({"-m", "--module", "--standalone", "--no-python", "--run-path",
                             "--use-env", "--virtual-local-rank"})


@dataclass(frozen=True)
class Node:
    """This doctor run's place in a multi-node job (``rank`` counts from 0)."""

    rank: int
    nnodes: int


def node_of(argv: Sequence[str], env: Mapping[str, str]) -> Node | None:
    """The node that runs ``argv`` in ``env``; None when the job runs on one node."""
    launcher = torchrun_args(argv)
    ranks: list[tuple[str, int | None]] = [("DOCTOR_NODE_RANK",
                                            _rank(env.get("DOCTOR_NODE_RANK")))]
    counts: list[tuple[str, int | None]] = [("DOCTOR_NNODES", _count(env.get("DOCTOR_NNODES")))]
    if launcher is not None:
        given = _option(launcher, "--nnodes", env.get("PET_NNODES"))
        counts.append(("torchrun --nnodes",
                       _count(given, elastic=True) if given is not None else 1))  # its default
        ranks.append(("torchrun --node-rank",
                      _rank(_option(launcher, "--node-rank", env.get("PET_NODE_RANK")))))
    ranks += [("SLURM_NODEID", _rank(env.get("SLURM_NODEID"))),
              ("OMPI_COMM_WORLD_RANK", _rank(env.get("OMPI_COMM_WORLD_RANK"))),
              ("PMI_RANK", _rank(env.get("PMI_RANK")))]
    counts += [(name, _count(env.get(name))) for name in (
        "SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES", "OMPI_COMM_WORLD_SIZE",
        "PMI_SIZE")]
    count_from, nnodes = _first(counts) or ("", 1)
    if nnodes == 1:
        return None
    found = _first(ranks)
    if found is None:
        raise UsageError(f"this job runs on {nnodes} nodes ({count_from}) but doctor cannot "
                         f"tell which node this is: set DOCTOR_NODE_RANK=<0..{nnodes - 1}> on "
                         "each node")
    rank_from, rank = found
    if rank >= nnodes:
        raise UsageError(f"node rank {rank} ({rank_from}) is not below the number of nodes "
                         f"{nnodes} ({count_from}): set DOCTOR_NODE_RANK and DOCTOR_NNODES")
    return Node(rank, nnodes)


def torchrun_args(argv: Sequence[str]) -> list[str] | None:
    """The launcher's own arguments when ``argv`` runs torchrun (up to the script it starts);
    None for any other command."""
    if not argv:
        return None
    rest: list[str]
    if Path(argv[0]).name == "torchrun":
        rest = list(argv[1:])
    else:
        words = list(argv)
        at = words.index("-m") if "-m" in words else -1  # python's options, then -m MODULE
        if at < 1 or at + 1 >= len(words) or words[at + 1] not in TORCHRUN_MODULES or any(
                not w.startswith("-") for w in words[1:at]):
            return None
        rest = words[at + 2:]
    out: list[str] = []
    i = 0
    while i < len(rest):
        word = rest[i]
        if word == "--" or not word.startswith("-"):
            break  # the script (or module) torchrun starts: its arguments are its own
        out.append(word)
        if "=" not in word and _spelled(word) not in _TORCHRUN_FLAGS and i + 1 < len(rest):
            out.append(rest[i + 1])
            i += 1
        i += 1
    return out


def _option(args: Sequence[str], name: str, default: str | None) -> str | None:
    """The value of the option ``name`` in ``args`` (``--name V`` or ``--name=V``, ``_`` or ``-``
    between its words; the last one given), else ``default``."""
    value = default
    for i, word in enumerate(args):
        key, eq, given = word.partition("=")
        if _spelled(key) != name:
            continue
        if eq:
            value = given
        elif i + 1 < len(args):
            value = args[i + 1]
    return value


def _spelled(option: str) -> str:
    """An option as torchrun's ``-`` spelling (it takes ``--node_rank`` as ``--node-rank``)."""
    return "--" + option[2:].replace("_", "-") if option.startswith("--") else option


def _first(found: Iterable[tuple[str, int | None]]) -> tuple[str, int] | None:
    for name, value in found:
        if value is not None:
            return name, value
    return None


def _int(text: str | None) -> int | None:
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:
        return None


def _rank(text: str | None) -> int | None:
    value = _int(text)
    return value if value is not None and value >= 0 else None


def _count(text: str | None, elastic: bool = False) -> int | None:
    """A number of nodes (``N``; with ``elastic``, also ``MIN:MAX``, which counts MAX)."""
    if text is None:
        return None
    low, colon, high = text.partition(":")
    if colon and not elastic:
        return None
    least, most = _int(low), _int(high if colon else low)
    if least is None or most is None or least < 1 or most < least:
        return None
    return most
