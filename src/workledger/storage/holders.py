"""Which holders of SQLite leases are alive, told by the operating system, not by clocks.

Every holder of a SQLite ledger is on the file's host, so the host can say whether it is still
there: a worker holds a shared ``flock`` on a file of its own, ``<db>.holders/<holder id>``,
for as long as it runs, and so does each of its handler processes (a handler process that
outlives its worker keeps the holder alive). A lock held is a live holder, whatever the clocks
of the processes say; a file whose lock can be taken exclusively is a holder that is gone
(the kernel released its locks when its last process ended), and the file is removed.

A holder's file is locked under a temporary name and only then renamed into place, so a
looker never finds the file of a live holder unlocked. flock on a network file system is not
dependable: a ledger there is documented as unsupported (docs/reliability.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import uuid
from pathlib import Path

TEMP = ".new-"


def new_holder_id() -> str:
    """A holder's id: its host, its process, and a few random characters (one per worker)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def holders_dir(db_path: str) -> Path:
    return Path(f"{db_path}.holders")


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


def alive(db_path: str) -> list[str]:
    """The ids of the live holders of this ledger; the files of the dead ones are removed."""
    folder = holders_dir(db_path)
    try:
        names = [n for n in os.listdir(folder) if not n.startswith(TEMP)]
    except OSError:
        return []
    live = []
    for name in names:
        try:
            fd = os.open(folder / name, os.O_RDONLY)
        except OSError:
            continue  # removed meanwhile: gone
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            live.append(name)  # somebody holds it: alive
        else:
            with contextlib.suppress(OSError):
                os.unlink(folder / name)
        finally:
            os.close(fd)
    return live
