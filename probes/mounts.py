"""The mount table (``/proc/PID/mountinfo``) and the kind of filesystem under a path: local
disk, memory (tmpfs), a container's overlay, a network filesystem (NFS, Lustre, CIFS, ...), an
object store mounted through FUSE (s3fs, gcsfuse, mountpoint-s3, ...) or another FUSE mount.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOCAL, MEMORY, OVERLAY, NETWORK, OBJECT_STORE, FUSE, OTHER = (
    "local disk", "memory", "overlay", "network filesystem", "object store (FUSE)", "FUSE",
    "other")
_LOCAL = {"ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "vfat", "exfat", "ntfs",
          "ntfs3", "jfs", "reiserfs", "bcachefs", "iso9660", "squashfs", "erofs"}
_MEMORY = {"tmpfs", "ramfs", "devtmpfs", "hugetlbfs"}
_OVERLAY = {"overlay", "overlayfs", "aufs", "fuse-overlayfs", "fuse.fuse-overlayfs"}
_NETWORK = {"nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph",
            "glusterfs", "fuse.glusterfs", "fuse.cephfs", "ceph-fuse", "fuse.ceph-fuse",
            "wekafs", "panfs", "orangefs", "pvfs2", "9p", "afs", "fuse.sshfs", "davfs",
            "fuse.juicefs", "fuse.lizardfs", "fuse.moosefs", "virtiofs"}
#: FUSE mounts of object stores, by the fstype's suffix or the source's name
_OBJECT_STORE = re.compile(r"s3fs|gcsfuse|goofys|rclone|mountpoint-s3|blobfuse|s3backer|"
                           r"geesefs|riofs|ossfs|cosfs|s3ql|alluxio|objectivefs", re.I)
_ESCAPE = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class Mount:
    mount_point: str
    fstype: str
    source: str

    @property
    def kind(self) -> str:
        return fs_kind(self.fstype, self.source)

    def describe(self) -> dict[str, Any]:
        return {"mount_point": self.mount_point, "fstype": self.fstype, "source": self.source,
                "kind": self.kind}


def fs_kind(fstype: str, source: str = "") -> str:
    """The kind of filesystem of a mount, from its type and source (mountinfo's fields)."""
    fstype = fstype.lower()
    if fstype in _OVERLAY:
        return OVERLAY
    if fstype.startswith("fuse") and (_OBJECT_STORE.search(fstype) or _OBJECT_STORE.search(source)):
        return OBJECT_STORE
    if fstype in _NETWORK or fstype.startswith("nfs"):
        return NETWORK
    if fstype in _LOCAL:
        return LOCAL
    if fstype in _MEMORY:
        return MEMORY
    if fstype.startswith("fuse"):
        return FUSE
    return OTHER


def parse_mountinfo(text: str) -> list[Mount]:
    """The mounts of a mountinfo text (``ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [TAGS] -
    FSTYPE SOURCE SUPER_OPTIONS``), in its order; malformed lines are left out."""
    mounts = []
    for line in text.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if not sep or len(fields) < 5 or not rest:
            continue
        mounts.append(Mount(_unescape(fields[4]), rest[0], _unescape(rest[1]) if len(rest) > 1
                            else ""))
    return mounts


def read_mountinfo(path: Path) -> list[Mount]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return parse_mountinfo(f.read(1 << 22))
    except OSError:
        return []


def mount_of(path: str, mounts: list[Mount]) -> int:
    """The index of the mount ``path`` is on: the longest mount point above it (of equal ones,
    the later: it hides the earlier); -1 for none."""
    best, best_len = -1, -1
    for i, m in enumerate(mounts):
        point = m.mount_point.rstrip("/")
        if (path == point or path.startswith(point + "/") or point == "") and \
                len(point) >= best_len:
            best, best_len = i, len(point)
    return best


def _unescape(text: str) -> str:
    return _ESCAPE.sub(lambda m: chr(int(m[1], 8)), text)
