"""Where the job's data comes from, from the parent's scans of the job's descriptors
(doctor.probes.open_files): the filesystem under the data files it read (local disk, memory,
overlay, network filesystem, an object store through FUSE), the dataset's size against the free
space where it could be staged, and the network: the TCP connections the job fetched over and
the bytes its network namespace received.

Over the scans given (the analysed steps' span): connections are the mean in flight per scan
(a fetch shorter than the time between two scans is seen in proportion to its length, so the
mean estimates the requests in flight); received bytes are the namespace's growth, on the
loopback where the job's connections were to this machine, on the other devices where they went
elsewhere: the namespace's, so other processes in it count too unless it is the job's own
(``namespace_own``). Distinct files seen open a second are a lower bound of the opens a second.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

MIB = 1 << 20
REMOTE_KINDS = ("network filesystem", "object store (FUSE)", "FUSE")


@dataclass(frozen=True)
class Place:
    """A mount: where the data was (role "data") or where it could be copied ("staging")."""

    mount_point: str
    fstype: str
    kind: str
    role: str
    files_seen: int
    bytes_seen: float
    dir_bytes: float  # the files in the folders the data files were in
    free_bytes: float


@dataclass(frozen=True)
class DataSource:
    places: tuple[Place, ...]
    seconds: float
    scans: int
    files_seen: int  # distinct data files first seen during the span
    connections: float  # mean TCP connections fetching, per scan
    remote_connections: float  # of them, to another host
    received_bytes: float | None  # the namespace's, on the devices the connections used
    namespace_own: bool | None

    @property
    def data(self) -> Place | None:
        """The mount most of the data files were on."""
        data = [p for p in self.places if p.role == "data"]
        return max(data, key=lambda p: (p.bytes_seen, p.files_seen)) if data else None

    @property
    def dataset_bytes(self) -> float:
        """The dataset's size, at least: the files in the data files' folders, or the data
        files seen where the folders were not read."""
        data = self.data
        return 0.0 if data is None else max(data.dir_bytes, data.bytes_seen)

    @property
    def network_filesystem(self) -> bool:
        data = self.data
        return data is not None and data.kind in REMOTE_KINDS

    @property
    def files_seen_per_s(self) -> float:
        return self.files_seen / self.seconds if self.seconds > 0 else 0.0

    @property
    def received_mb_per_s(self) -> float | None:
        if self.received_bytes is None or self.seconds <= 0:
            return None
        return self.received_bytes / self.seconds / 1e6

    @property
    def mb_per_s_per_connection(self) -> float | None:
        rate = self.received_mb_per_s
        return rate / self.connections if rate is not None and self.connections > 0 else None

    def staging(self, free_for: float) -> list[Place]:
        """The places to copy the data to with room for ``free_for`` bytes (memory first)."""
        spots = [p for p in self.places if p.role == "staging" and p.free_bytes >= free_for
                 and p.kind in ("memory", "local disk", "overlay")]
        return sorted(spots, key=lambda p: p.kind != "memory")

    def to_evidence(self) -> dict[str, object]:
        data = self.data
        out: dict[str, object] = {
            "data_fs_kind": data.kind if data else None,
            "data_fs_type": data.fstype if data else None,
            "data_mount": data.mount_point if data else None,
            "dataset_mib_at_least": round(self.dataset_bytes / MIB, 1) if data else None,
            "files_seen_open_per_s": round(self.files_seen_per_s, 1),
            "connections_in_flight": round(self.connections, 2),
            "remote_connections_in_flight": round(self.remote_connections, 2),
            "network_mb_per_s": _rounded(self.received_mb_per_s),
            "network_mb_per_s_per_connection": _rounded(self.mb_per_s_per_connection),
            "network_bytes_of": "the job's own network namespace" if self.namespace_own else
                                "the network namespace the job shares (other processes count)",
        }
        return out


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def data_source(scans: pd.DataFrame | None, mounts: pd.DataFrame | None,
                span: tuple[float, float] | None = None) -> DataSource | None:
    """The data source over the scans in ``span`` (seconds from the run's start; None: all);
    None where the scans were not taken (an older run, a trace, another door)."""
    if scans is None or scans.empty:
        return None
    if span is not None:
        inside = scans[(scans["t_s"] >= span[0]) & (scans["t_s"] <= span[1])]
        scans = inside if len(inside) >= 2 else scans
    scans = scans.sort_values("t_s")
    seconds = float(scans["t_s"].iloc[-1] - scans["t_s"].iloc[0])
    conns = float(np.nanmean(scans["connections"])) if len(scans) else 0.0
    remote = float(np.nanmean(scans["remote_connections"])) if len(scans) else 0.0
    column = "rx_bytes" if remote > 0 else "rx_lo_bytes"
    rx = scans[column].dropna()
    received = float(rx.iloc[-1] - rx.iloc[0]) if len(rx) >= 2 else None
    own = scans["netns_own"].dropna()
    places = tuple(_places(mounts))
    return DataSource(places, seconds, len(scans), int(np.nansum(scans["files_new"].iloc[1:])),
                      conns, remote, received, bool(own.iloc[-1]) if len(own) else None)


def _places(mounts: pd.DataFrame | None) -> list[Place]:
    if mounts is None or mounts.empty:
        return []
    numbers = mounts[["files_seen", "bytes_seen", "dir_bytes", "free_bytes"]].fillna(0.0)
    return [Place(str(r["mount_point"]), str(r["fstype"]), str(r["kind"]), str(r["role"]),
                  int(n[0]), float(n[1]), float(n[2]), float(n[3]))
            for (_, r), n in zip(mounts.iterrows(), numbers.to_numpy(np.float64), strict=True)]
