"""Which holders of SQLite leases are alive, told by the operating system, not by clocks.

Every holder of a SQLite ledger is on the file's host, so the host can say whether it is still
there: a worker holds a shared ``flock`` on a file of its own, ``<db>.holders/<holder id>``,
for as long as it runs, and so does each of its handler processes (a handler process that
outlives its worker keeps the holder alive). A lock held is a live holder, whatever the clocks
of the processes say; a file whose lock can be taken exclusively is a holder that is gone
(the kernel released its locks when its last process ended), and the file is removed.

A holder's file is locked under a temporary name and only then renamed into place, so a
looker never finds the file of a live holder unlocked. Only a file found unlocked proves its
holder gone; a holder whose file is missing, or that cannot be looked at, is never taken from at
once (its leases' time decides, or nothing, see :class:`Liveness`). flock on a network file
system is not dependable: a ledger there is documented as unsupported (docs/reliability.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

TEMP = ".new-"
# a dead holder's file stays this long (seconds), so that every reclaim of a sweep pass sees it
# dead and takes its items at once; after that its leftover items wait for their leases' time
DEAD_KEEP = 120.0


def new_holder_id() -> str:
    """A holder's id: its host, its process, and a few random characters (one per worker)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def holders_dir(db_path: str) -> Path:
    """``<db>.holders`` beside the file itself: the path resolved (a relative path, a symlink),
    so every process finds the same folder whatever its working directory."""
    return Path(f"{os.path.realpath(db_path)}.holders")


class HolderFile:
    """This process's holder: its id and the open, locked file that keeps it alive."""

    def __init__(self, db_path: str) -> None:
        folder = holders_dir(db_path)
        folder.mkdir(mode=0o700, exist_ok=True)
        self.id = new_holder_id()
        temp = folder / f"{TEMP}{uuid.uuid4().hex}"
        self.path = folder / self.id.replace("/", "_")
        self._fd: int | None = os.open(temp, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_SH)
            os.rename(temp, self.path)
        except BaseException:
            os.close(self._fd)
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise

    def close(self) -> None:
        """This holder is done: its leases may be taken back at once."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        os.close(self._fd)
        self._fd = None


def join(path: str) -> int | None:
    """In a handler process: hold the worker's holder alive too, for as long as this process
    lives (the descriptor stays open on purpose). None if the file is gone already."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:  # a looker holds it for an instant: the worker is gone anyway
        os.close(fd)
        return None
    return fd


@dataclass(frozen=True)
class Liveness:
    """What the host tells of a ledger's holders: those alive (their lock is held, or their
    file cannot be looked at: a holder nobody can judge is never taken from), those proven gone
    (their file's lock could be taken), and whether it could tell at all (the folder could be
    read). A holder in neither list (its file missing) is judged by its lease's time."""

    alive: tuple[str, ...] = ()
    dead: tuple[str, ...] = ()
    told: bool = True


def look(db_path: str, now: float | None = None) -> Liveness:
    """The liveness of this ledger's holders. A dead holder's file is kept ``DEAD_KEEP``
    seconds (so every reclaim of a sweep pass sees it dead) and removed after."""
    folder = holders_dir(db_path)
    try:
        names = [n for n in os.listdir(folder) if not n.startswith(TEMP)]
    except FileNotFoundError:
        return Liveness()
    except OSError:
        return Liveness(told=False)  # cannot read the folder: take nothing from any holder
    now = time.time() if now is None else now
    live, dead = [], []
    for name in names:
        path = folder / name
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue  # removed meanwhile: judged by its leases' time
        except OSError:
            live.append(name)  # cannot look (permissions, no descriptors left): not gone
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            live.append(name)  # somebody holds it (or the lock cannot be tried): alive
        else:
            dead.append(name)
            with contextlib.suppress(OSError):
                if now - os.fstat(fd).st_mtime > DEAD_KEEP:
                    os.unlink(path)
        finally:
            os.close(fd)
    return Liveness(tuple(live), tuple(dead))
