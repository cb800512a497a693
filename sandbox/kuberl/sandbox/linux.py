"""The Linux system calls the jail needs that Python 3.11's `os` module lacks, through the C library.

unshare(2) for namespaces, mount(2) and chroot's companions for the jail's filesystem, prctl(2) for the
per-process flags (no new privileges, parent-death signal, child subreaper, not dumpable).
"""

from __future__ import annotations

import ctypes
import os

CLONE_NEWNS = 0x00020000  # mount namespace
CLONE_NEWUTS = 0x04000000  # hostname
CLONE_NEWIPC = 0x08000000  # System V IPC, POSIX message queues
CLONE_NEWUSER = 0x10000000  # user namespace
CLONE_NEWPID = 0x20000000  # process ids: the next child is pid 1 of a new namespace
CLONE_NEWNET = 0x40000000  # network: only a loopback device, down

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000

PR_SET_PDEATHSIG = 1  # the signal this process gets when its parent dies
PR_SET_DUMPABLE = 4  # 0: no core dumps, no ptrace and no /proc/PID/mem by processes of the same uid
PR_SET_CHILD_SUBREAPER = 36  # orphaned descendants are re-parented to this process instead of init
PR_SET_NO_NEW_PRIVS = 38  # execve never grants privileges (setuid bits, file capabilities)

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, call: str, *args: object) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{call}({', '.join(map(repr, args))}): {os.strerror(errno)}")


def unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare", hex(flags))


def mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(
        _libc.mount(
            source.encode(),
            target.encode(),
            None if fstype is None else fstype.encode(),
            ctypes.c_ulong(flags),
            None if data is None else data.encode(),
        ),
        "mount",
        source,
        target,
        fstype,
        hex(flags),
        data,
    )


def prctl(option: int, value: int) -> None:
    _check(_libc.prctl(ctypes.c_int(option), ctypes.c_ulong(value), 0, 0, 0), "prctl", option, value)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


_LINUX_CAPABILITY_VERSION_3 = 0x20080522


def drop_capabilities() -> None:
    """Clear this process's effective, permitted and inheritable capabilities (capset(2); ambient ones follow)."""
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(header), data), "capset")
