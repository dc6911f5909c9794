"""What the peer-socket rule costs the procfs source a cycle (docs/performance.md, "The
peer-socket rule"): reading engine API servers' sockets with span senders' connections
wanted (every server read, tables past the listeners) against without (bound servers
kept from the last cycle).

    PYTHONPATH=exporter .venv/bin/python -m benchmarks.bench_peer_socket

A synthetic /proc in the kernel's formats (identity/sockets.py): SERVERS API servers, each
in its own network namespace with 64 descriptors and a table of one listener and CONNS
established connections (a busy engine's clients), one of them a span sender's.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gpuledger.model.procfs import HeldConnection
from gpuledger.sources.procfs.sockets import BoundSockets

SERVERS = 16
ROUNDS = 30
HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid"


def _end(ip: tuple[int, int, int, int], port: int) -> str:
    return f"{int.from_bytes(bytes(ip), sys.byteorder):08X}:{port:04X}"


def _line(n: int, local: str, remote: str, state: str, inode: int) -> str:
    return (
        f"{n:4d}: {local} {remote} {state} 00000000:00000000 00:00000000 00000000"
        f"     0        0 {inode} 1 0000000000000000 100 0 0 10 0"
    )


def build(root: Path, conns: int) -> frozenset[HeldConnection]:
    wanted = set()
    for s in range(SERVERS):
        pid, inode = 1000 + s, 100_000 * (s + 1)
        ip = (10, 0, s, 5)
        base = root / str(pid)
        for sub in ("fd", "ns", "net"):
            (base / sub).mkdir(parents=True)
        os.symlink(f"net:[{4026532000 + s}]", base / "ns" / "net")
        lines = [HEADER, _line(0, _end(ip, 8000), "00000000:0000", "0A", inode)]
        for c in range(conns):
            lines.append(
                _line(
                    c + 1,
                    _end(ip, 8000),
                    _end((10, 1, c // 250, c % 250), 40000 + c),
                    "01",
                    inode + 1 + c,
                )
            )
        lines.append(
            _line(conns + 1, _end(ip, 41234), _end((10, 0, s, 1), 4317), "01", inode + 99_999)
        )
        (base / "net" / "tcp").write_text("\n".join(lines) + "\n")
        held = [inode, inode + 99_999, *range(inode + 1, inode + 63)]
        for fd, i in enumerate(held[:64]):
            os.symlink(f"socket:[{i}]", base / "fd" / str(fd))
        fields = " ".join(["0"] * 17)
        (base / "stat").write_text(f"{pid} (python3) S 1 {fields} 4242\n")
        wanted.add(HeldConnection(f"10.0.{s}.5", 41234, 4317))
    return frozenset(wanted)


def cycle_ms(root: Path, wanted: frozenset[HeldConnection]) -> float:
    bound = BoundSockets()
    pids = [1000 + s for s in range(SERVERS)]
    bound.read(str(root), pids, time.monotonic() + 10, wanted)  # first cycle: everything read
    times = []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        found = bound.read(str(root), pids, time.monotonic() + 10, wanted)
        times.append((time.perf_counter() - started) * 1000)
    if wanted:
        assert all(len(found[p].connections) == 1 for p in pids), found
    return statistics.median(times)


def main() -> None:
    print(f"{SERVERS} API servers, each its own namespace; median of {ROUNDS} cycles")
    for conns in (10, 1000, 8000):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            wanted = build(root, conns)
            without, with_ = cycle_ms(root, frozenset()), cycle_ms(root, wanted)
        print(
            f"  {conns:5d} connections a table: without senders {without:6.2f} ms, "
            f"with a sender each {with_:7.2f} ms"
        )


if __name__ == "__main__":
    main()
