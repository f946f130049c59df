"""A round through a real broker: RQ on the real Redis, and what a broker does to messages.

In a round that draws a broker fault (plan.py ``BROKER_KINDS``) the chaos app dispatches its
work as RQ jobs on a queue of the round's own (chaos_app.py reads ``CHAOS_QUEUE`` and
``CHAOS_BROKER_URL``), and the supervised workers are ``rq worker -w
workledger.contrib.rq.Worker`` processes; the workers a fault starts (a failpoint, a skewed
clock, a partition) stay ``workledger worker`` processes, claiming from the same ledger.

The faults, done to the queue behind the workers' backs as a broker may:

- ``broker_dup``: copies of messages, published again: of every message waiting in the queue
  (``queued``), of the messages being run right now (``running``: the copy arrives while their
  items are claimed), or of messages seen earlier in the round and long since run (``stale``:
  the copy arrives after their items moved on, were retried or released);
- ``broker_delay``: every message waiting in the queue taken out for the fault's seconds
  (longer than the lease and the ledger's redispatch wait) and put back.

Neither may make a non-idempotent effect happen twice, lose an item, or hold a run past the
campaign's bound (the oracle's checks D, L and V).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
DELIVER = "workledger.contrib.rq.deliver"
KEEP_SEEN = 200  # message bodies kept for stale copies
DUP_ORDER = ("running", "queued", "stale")  # the fallbacks of a copy that finds nothing
LOOK_EVERY = 0.5  # seconds between looks at the queue (stale copies need bodies seen)


def why_not() -> str | None:
    """Why no round can go through a broker here (None: it can)."""
    try:
        import redis  # noqa: F401
        import rq  # noqa: F401
    except ImportError as exc:
        return f"rq is not installed ({exc.name}): pip install -e '.[rq]'"
    try:
        with socket.create_connection((REDIS_HOST, REDIS_PORT), timeout=2):
            pass
    except OSError as exc:
        return f"Redis is unreachable at {REDIS_HOST}:{REDIS_PORT}: {exc}"
    return None


class RQBroker:
    """The round's queue on the real Redis: the environment its processes need, the
    ``rq worker`` command line, the faults, and the cleanup when the round ends."""

    def __init__(self, seed: int, number: int) -> None:
        from redis import Redis
        from rq import Queue

        self.url = f"redis://{REDIS_HOST}:{REDIS_PORT}/0"
        self.queue_name = f"wl-chaos-{seed}-{number}-{os.getpid()}"
        self.redis = Redis.from_url(self.url)
        self.queue = Queue(self.queue_name, connection=self.redis)
        self.seen: list[tuple[float, Any]] = []  # (when, body) of messages seen in the queue
        self.copies = 0
        self.delayed = 0
        self._workers = 0
        self._lock = threading.Lock()

    def env(self, lease: float, chunk: int, concurrency: int) -> dict[str, str]:
        """What the chaos app reads to dispatch through this queue (chaos_app.py)."""
        return {"CHAOS_BROKER_URL": self.url, "CHAOS_QUEUE": self.queue_name,
                "CHAOS_LEASE": f"{lease:g}", "CHAOS_CHUNK": str(chunk),
                "CHAOS_CONCURRENCY": str(concurrency)}

    def worker_argv(self) -> list[str]:
        self._workers += 1
        rq_bin = Path(sys.executable).parent / "rq"
        return [str(rq_bin), "worker", "-w", "workledger.contrib.rq.Worker", "--url", self.url,
                "--logging_level", "INFO", "-n", f"{self.queue_name}-{self._workers}",
                self.queue_name]

    # -- what a broker may do ----------------------------------------------------------------

    def _bodies(self, job_ids: list[str]) -> list[Any]:
        from rq.exceptions import NoSuchJobError
        from rq.job import Job

        bodies = []
        for job_id in job_ids:
            try:
                job = Job.fetch(job_id, connection=self.redis)
            except NoSuchJobError:
                continue  # run and gone meanwhile (result_ttl=0)
            if job.func_name == DELIVER and job.args:
                bodies.append(job.args[0])
        return bodies

    def look(self) -> None:
        """Remember the bodies of the messages waiting now, for stale copies later."""
        bodies = self._bodies(self.queue.get_job_ids()[:50])
        now = time.time()
        with self._lock:
            self.seen.extend((now, b) for b in bodies)
            del self.seen[:-KEEP_SEEN]

    def duplicate(self, mode: str, pick: float) -> tuple[str, int]:
        """Publish copies of messages (see the module's doc): the drawn ``mode`` first, then
        the others, so that a queue the workers keep empty still gets its copies (a drawn
        ``queued`` finds none most of the time); the mode done and how many."""
        self.look()
        for each in [mode, *[m for m in DUP_ORDER if m != mode]]:
            bodies = self._copies(each, pick)
            if bodies:
                for body in bodies:
                    self.queue.enqueue(DELIVER, body, result_ttl=0)
                self.copies += len(bodies)
                return each, len(bodies)
        return mode, 0

    def _copies(self, mode: str, pick: float) -> list[Any]:
        from rq.registry import StartedJobRegistry

        if mode == "queued":
            return self._bodies(self.queue.get_job_ids()[:20])
        if mode == "running":
            registry = StartedJobRegistry(self.queue_name, connection=self.redis)
            return self._bodies(registry.get_job_ids()[:20])
        with self._lock:  # stale: seen two seconds ago or more
            old = [b for at, b in self.seen if time.time() - at >= 2.0]
        return old[int(pick * len(old)):][:10]

    def take_out(self) -> list[str]:
        """Take every waiting message out of the queue (their jobs are kept); their ids."""
        self.look()
        taken = []
        for job_id in self.queue.get_job_ids():
            if self.redis.lrem(self.queue.key, 0, job_id):
                taken.append(job_id)
        self.delayed += len(taken)
        return taken

    def put_back(self, job_ids: list[str]) -> None:
        for job_id in job_ids:
            self.queue.push_job_id(job_id)

    def waiting(self) -> int:
        return int(self.queue.count)

    def close(self) -> None:
        """Remove what the round left on Redis: its queue, registries, jobs and the ledger's
        keys for it."""
        try:
            keys = list(self.redis.scan_iter(f"*{self.queue_name}*"))
            keys += [k for k in self.redis.scan_iter("rq:job:*")
                     if self.redis.type(k) == b"hash"
                     and self.redis.hget(k, "origin") == self.queue_name.encode()]
            if keys:
                self.redis.delete(*keys)
        finally:
            self.redis.close()
