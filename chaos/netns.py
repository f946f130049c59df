"""A network partition between one worker and the PostgreSQL server (issue 21): the worker runs
in a network namespace of the campaign's own, joined to the host by a veth pair, and the
server listens on the host's end too. ``cut()`` sets the host's end down: packets are dropped
both ways, no reset is sent, each side's connection just stops hearing from the other, as in a
real partition; ``heal()`` sets it up again and the same connections carry on.

Loopback and the campaign's own namespace only: nothing outside the machine is touched, and
``remove()`` (or the end of the process that made it, through ``ip netns del``) takes both
ends of the pair away. Needs root and iproute2 (``ip``); :func:`why_not` says what is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess

SUBNET = "10.231.0.0/16"  # the pairs' addresses; the private server trusts this range


def why_not() -> str | None:
    """Why no partition can be made here (None: one can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2 (ip) is not installed"
    return None


class Partition:
    """One namespace and one veth pair: ``host`` is the server's address on the pair, and a
    command run through :meth:`wrap` reaches the server only there."""

    def __init__(self, tag: int) -> None:
        n = tag % 250 + 1
        self.name = f"wlchaos-{os.getpid()}-{tag}"
        suffix = f"{os.getpid() % 100000}{tag % 10}"
        self.outer, self.inner = f"wlo{suffix}", f"wli{suffix}"  # at most 15 characters
        self.host, self.guest = f"10.231.{n}.1", f"10.231.{n}.2"
        self.made = False
        self.down = False

    def _ip(self, *args: str, netns: bool = False) -> None:
        argv = ["ip", *(["netns", "exec", self.name, "ip"] if netns else []), *args]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")

    def create(self) -> None:
        self._ip("netns", "add", self.name)
        self.made = True
        self._ip("link", "add", self.outer, "type", "veth", "peer", "name", self.inner)
        self._ip("link", "set", self.inner, "netns", self.name)
        self._ip("addr", "add", f"{self.host}/30", "dev", self.outer)
        self._ip("link", "set", self.outer, "up")
        self._ip("addr", "add", f"{self.guest}/30", "dev", self.inner, netns=True)
        self._ip("link", "set", self.inner, "up", netns=True)
        self._ip("link", "set", "lo", "up", netns=True)

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the namespace (its environment and files are the host's)."""
        return ["ip", "netns", "exec", self.name, *argv]

    def cut(self) -> None:
        self._ip("link", "set", self.outer, "down")
        self.down = True

    def heal(self) -> None:
        self._ip("link", "set", self.outer, "up")
        self.down = False

    def remove(self) -> None:
        if self.made:
            subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=30)
            subprocess.run(["ip", "link", "del", self.outer], capture_output=True, timeout=30)
            self.made = False
