"""Links probe: what the ranks' collectives can run over, measured or stated once after a
distributed job, from the ``doctor run`` parent (the job is over: it costs the job nothing).

- ``stated_gb_per_s``: the network between nodes as the user states it
  (``DOCTOR_LINK_GBPS``, GB/s; a cluster's fabric is rarely visible from inside a node);
- ``nic`` / ``nic_gb_per_s``: the fastest network interface that is up, and its speed
  (the kernel's, through psutil; loopback and virtual bridges left out);
- ``loopback_gb_per_s``: TCP over loopback, measured (``LOOPBACK_BYTES`` through a local
  socket, about a tenth of a second): the link of ranks on one host that talk over TCP (gloo).

The GPUs' own links (NVLink, PCIe) are read by the GPU probe into gpus.json.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any

ENV_LINK = "DOCTOR_LINK_GBPS"
LOOPBACK_BYTES = 128 * 2**20
_CHUNK = 1 << 20
_VIRTUAL = ("lo", "docker", "veth", "br-", "virbr", "cni", "flannel", "cali", "tun", "tap")


def stated_gb_per_s(env: Mapping[str, str] | None = None) -> float | None:
    text = (env if env is not None else os.environ).get(ENV_LINK, "").strip()
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value > 0 else None


def fastest_nic() -> tuple[str, float] | None:
    """(name, GB/s) of the fastest interface that is up and reports a speed."""
    import psutil

    best: tuple[str, float] | None = None
    for name, stats in psutil.net_if_stats().items():
        if not stats.isup or stats.speed <= 0 or name.startswith(_VIRTUAL):
            continue
        gb = stats.speed / 8000.0  # Mbit/s -> GB/s
        if best is None or gb > best[1]:
            best = (name, gb)
    return best


def loopback_gb_per_s(nbytes: int = LOOPBACK_BYTES) -> float:
    """TCP throughput over 127.0.0.1, one stream, GB/s."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    payload = b"\0" * _CHUNK

    def send() -> None:
        with socket.create_connection(("127.0.0.1", port)) as out:
            for _ in range(nbytes // _CHUNK):
                out.sendall(payload)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    conn, _ = server.accept()
    buf = bytearray(_CHUNK)
    got = 0
    start = time.perf_counter()
    with conn:
        while got < nbytes:
            n = conn.recv_into(buf)
            if n == 0:
                break
            got += n
    seconds = time.perf_counter() - start
    sender.join(timeout=5)
    server.close()
    return got / seconds / 1e9 if seconds > 0 else 0.0


def links(env: Mapping[str, str] | None = None, *, loopback: bool = True) -> dict[str, Any]:
    """What run.json keeps (see the module docstring); each figure absent where unknown."""
    out: dict[str, Any] = {}
    stated = stated_gb_per_s(env)
    if stated is not None:
        out["stated_gb_per_s"] = stated
    try:
        nic = fastest_nic()
        if nic is not None:
            out["nic"], out["nic_gb_per_s"] = nic
    except Exception:  # each figure is absent where unknown (psutil cannot list interfaces)
        pass
    if loopback:
        try:
            out["loopback_gb_per_s"] = round(loopback_gb_per_s(), 3)
        except OSError:
            pass
    return out
