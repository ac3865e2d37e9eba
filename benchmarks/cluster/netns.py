"""Two "hosts" on one box: two network namespaces joined by a veth pair.

Each namespace has its own network stack (loopback + one end of the veth), so processes in them
talk over a real, non-loopback interface (10.213.0.1 <-> 10.213.0.2 by default) as two hosts on
a private network would; nothing is routed outside the pair. Needs root (CAP_NET_ADMIN).

    python -m benchmarks.cluster.netns up       # prints the namespaces and addresses
    python -m benchmarks.workloads.allreduce --netns sxA,sxB --addresses 10.213.0.1,10.213.0.2 \
        --tag cross_host
    python -m benchmarks.cluster.netns down

The test ``tests/multiprocess/test_two_hosts.py`` uses ``TestBed`` with unique names and removes
what it made in its teardown.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass


class NetnsUnavailable(RuntimeError):
    """Namespaces or veth links cannot be made here (not root, no ``ip``, a sandbox)."""


def _ip(*args: str) -> None:
    try:
        proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise NetnsUnavailable(f"`ip {' '.join(args)}` could not run: {error}") from error
    if proc.returncode:
        raise NetnsUnavailable(f"`ip {' '.join(args)}` failed: {proc.stderr.strip()}")


@dataclass
class TestBed:
    """Namespaces ``names`` with addresses ``addresses`` (a /24), joined by one veth pair.

    Example::

        bed = TestBed(("sxA", "sxB")); bed.up()
        try: ...  # ip netns exec sxA python ...
        finally: bed.down()
    """

    __test__ = False  # not a pytest test class
    names: tuple[str, str] = ("sxA", "sxB")
    addresses: tuple[str, str] = ("10.213.0.1", "10.213.0.2")

    def up(self) -> None:
        """Creates both namespaces and the link; on any failure removes what it made.

        Raises:
            NetnsUnavailable: something could not be created (the message says what).
        """
        a, b = self.names
        try:
            for name in self.names:
                _ip("netns", "add", name)
            _ip("link", "add", f"{a}-v", "netns", a, "type", "veth", "peer", "name", f"{b}-v",
                "netns", b)
            for name, address in zip(self.names, self.addresses, strict=True):
                _ip("-n", name, "addr", "add", f"{address}/24", "dev", f"{name}-v")
                _ip("-n", name, "link", "set", f"{name}-v", "up")
                _ip("-n", name, "link", "set", "lo", "up")
        except NetnsUnavailable:
            self.down()
            raise

    def down(self) -> None:
        """Removes both namespaces (their veth ends go with them); ignores what is not there."""
        for name in self.names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=20)

    def exec_prefix(self, index: int) -> list[str]:
        """The command prefix that runs a program inside namespace ``index``."""
        return ["ip", "netns", "exec", self.names[index]]


def main(argv: list[str]) -> int:
    bed = TestBed()
    if argv[1:] == ["up"]:
        bed.up()
        print(f"namespaces {','.join(bed.names)} addresses {','.join(bed.addresses)}")
        return 0
    if argv[1:] == ["down"]:
        bed.down()
        return 0
    print("usage: python -m benchmarks.cluster.netns up|down", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
