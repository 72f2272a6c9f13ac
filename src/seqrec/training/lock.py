"""A run directory's lock: one training at a time holds it; a lock whose holder has died (on
this host) is taken over, one held on another host only with `break_lock`."""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from seqrec.errors import RunError

__all__ = ["hold", "take_lock"]


@contextlib.contextmanager
def hold(
    run_dir: Path,
    path: Path,
    break_lock: bool,
    names: Sequence[str],
    *,
    wait: float = 0.0,
    what: str = "training",
) -> Iterator[None]:
    """Hold `run_dir` for one writer (`what`: a training, a catalogue change) through its lock
    file `path`: a second one waits up to `wait` seconds for it, then is refused in one line
    naming the holder.

    The lock is `fcntl.flock` on `.lock`, which the kernel releases when its holder dies,
    so a lock left by a killed process is taken over at once; the file records the holder's
    pid, start time and host for the message. A lock file naming another host (a directory
    on shared storage, where flock may not reach across machines) is refused unless
    `break_lock`; one naming a process of this host that still runs with the same start
    time (a holder that did not flock) is refused; a reused pid is not taken for it. Once
    held, the half-written temporary files of the run files `names`, left by a process killed
    while writing them (atomic_write's `.<name>.*`, the weights' `.<name>.new`), are removed:
    never read."""
    created = not run_dir.exists()
    try:
        fd = take_lock(run_dir, path, break_lock, wait=wait, what=what)
    except BaseException:
        if created:  # a lock not taken leaves no directory it made
            with contextlib.suppress(OSError):
                run_dir.rmdir()
        raise
    for p in run_dir.iterdir():
        hidden = p.name.startswith(".") and p.name != path.name
        if hidden and any(p.name.lstrip(".").startswith(f"{n}.") for n in names):
            p.unlink(missing_ok=True)
    try:
        yield
    finally:
        try:
            path.unlink(missing_ok=True)  # before the lock goes: a waiter re-checks the inode
        finally:
            os.close(fd)
        if created:
            with contextlib.suppress(OSError):  # a run that failed before writing anything
                run_dir.rmdir()  # leaves nothing (only when empty)


def take_lock(
    run_dir: Path, path: Path, break_lock: bool, *, wait: float = 0.0, what: str = "training"
) -> int:
    me = f"{os.getpid()} {_start_time(os.getpid())} {socket.gethostname()}"
    deadline = time.monotonic() + wait
    pause = 0.005
    for _ in range(1_000_000):
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except FileExistsError:  # there, then removed by a holder leaving before it was seen
            if run_dir.exists() and not run_dir.is_dir():
                raise
            continue
        try:
            fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
        except FileNotFoundError:  # the directory was removed by a holder leaving: again
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 256, 0).decode(errors="replace").split()
            os.close(fd)
            if time.monotonic() < deadline:  # held by another writer: wait for its turn
                time.sleep(pause)
                pause = min(0.1, pause * 2)
                continue
            hint = "wait for it or choose another --out" if what == "training" else "try again"
            raise RunError(f"{run_dir}: {_held(owner)}; {hint}") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if not same:  # the holder unlinked it before we locked: lock the new file instead
            os.close(fd)
            continue
        owner = os.pread(fd, 256, 0).decode(errors="replace").split()
        if owner and not break_lock and _still_held(owner):
            os.close(fd)
            host = owner[-1] if len(owner) > 1 else "?"
            hint = (
                "; seqrec cannot tell whether it still runs there: --break-lock takes it"
                if host != socket.gethostname()
                else ""
            )
            raise RunError(f"{run_dir}: {_held(owner)}{hint}")
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, me.encode(), 0)
        except OSError as err:  # a full disk: the lock file is not left behind
            path.unlink(missing_ok=True)
            os.close(fd)
            raise RunError(f"{path}: could not be written ({err.strerror or err})") from None
        return fd
    raise RunError(f"{run_dir}: could not take the lock {path}")


def _held(owner: list[str]) -> str:
    host = owner[-1] if len(owner) > 1 else "?"
    return f"in use by another writer (pid {owner[0] if owner else '?'} on {host})"


def _start_time(pid: int) -> str:
    """The process's start time (clock ticks since boot, /proc/PID/stat field 22); "?" where
    there is no /proc. With the pid it names one process: pids are reused, start times not."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return "?"


def _still_held(owner: list[str]) -> bool:
    """Whether the process a lock file names (`pid [start] host`) may still hold it: another
    host's, always; this host's, when that pid runs with the recorded start time."""
    if len(owner) > 1 and owner[-1] != socket.gethostname():
        return True
    try:
        pid = int(owner[0])
        os.kill(pid, 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:  # exists, owned by another user
        pass
    recorded = owner[1] if len(owner) == 3 else "?"
    return recorded == "?" or recorded == _start_time(pid)
