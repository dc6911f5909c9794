"""procfs source: cgroup, parentage, title and whitelisted environment of GPU processes.

Reads `<proc-root>/<pid>/…` for the PIDs NVML reports and their ancestors, and, while
engines are scraped, every engine-retitled process and its ancestors: an engine's API
server holds no GPU and may have no GPU process below it (on the Ray executor the
workers are the raylet's children, identity rule 9), yet its flags are the engine's
configuration and its socket names its target (identity rule 6), and while the span
receiver has senders, the connection it exported over names the spans' sender (rule 10).
A process that exits
between two reads, or a file we may not read, is a normal event: that process is
skipped (or kept without the unreadable part), never an error.

Secrets: `environ` and `cmdline` hold tokens. Values are parsed in memory and only the
names in ALLOWED_ENV / ALLOWED_FLAGS are kept; nothing else leaves this module.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path

from gpuledger.engines import KINDS, TITLE_PREFIXES, flag_whitelist, is_engine_title
from gpuledger.identity.cgroup import NO_IDENTITY, parse_cgroup_file
from gpuledger.identity.sockets import sending_end
from gpuledger.model import Snapshots, frozen_map
from gpuledger.model.engines import ENGINES
from gpuledger.model.nvml import NVML
from gpuledger.model.procfs import PROCESSES, HeldConnection, ProcessInfo, ProcSnapshot
from gpuledger.model.spans import SPANS, SpansSnapshot
from gpuledger.sources.base import Source, SourceError
from gpuledger.sources.procfs.sockets import BoundSockets, api_servers

log = logging.getLogger(__name__)


# Identity rule 5: the only environment variables ever read (each engine kind adds its
# own, gpuledger.engines). Documented in docs/security.md.
ALLOWED_ENV = frozenset(
    {"CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"}
).union(*(kind.env for kind in KINDS))

# Identity rule 6: the only command-line flags ever read (engine configuration, from
# each engine kind). Short aliases map to the long name.
ALLOWED_FLAGS: dict[str, str] = flag_whitelist()

MAX_ANCESTRY = 64
_SMALL_FILE = 64 * 1024
_ENVIRON_LIMIT = 1024 * 1024
_TITLE_LIMIT = 128


_CHUNK = 16 * 1024

# The engine scan (ProcfsSource.engine_pids): /proc entries looked at, engine processes
# kept (256 engines, each an EngineCore and up to 7 Workers), and the bytes of each
# cmdline read, far more than any engine title.
MAX_SCANNED = 65_536
MAX_ENGINE_PROCESSES = 2_048
_TITLE_HEAD = 256
_TITLE_BYTES = tuple(p.encode() for p in TITLE_PREFIXES)


def _read(path: str, limit: int) -> bytes | None:
    """At most `limit` bytes of a /proc file; None if it cannot be read.

    Read in small chunks: `open(...).read(limit)` allocates `limit` bytes up front, and
    with the 1 MiB environ limit that was an mmap and munmap per process, half of this
    source's CPU time in the kernel. /proc files report no size to read ahead by.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:  # vanished, no permission, not a process: all ordinary here
        return None
    try:
        chunks: list[bytes] = []
        remaining = limit
        while remaining > 0:
            chunk = os.read(fd, min(_CHUNK, remaining))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def parse_status(text: str) -> tuple[int | None, tuple[int, ...]]:
    """PPid and NSpid (host PID first) from /proc/<pid>/status."""
    ppid: int | None = None
    nspid: tuple[int, ...] = ()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        try:
            if key == "PPid":
                ppid = int(value.strip())
            elif key == "NSpid":
                nspid = tuple(int(v) for v in value.split())
        except ValueError:
            continue
    return ppid, nspid


def parse_title(cmdline: bytes) -> str:
    """argv[0]'s first word: the title engines (gpuledger.engines) and Ray set.

    Only the first word: setproctitle-style titles may be a whole command line in one
    string, and anything after the first word could be an argument.
    """
    first = cmdline.split(b"\0", 1)[0].decode(errors="replace").strip()
    word = first.split(maxsplit=1)[0] if first else ""
    if "/" in word and not is_engine_title(word):
        word = word.rsplit("/", 1)[1]
    return word[:_TITLE_LIMIT]


def parse_flags(cmdline: bytes) -> dict[str, str]:
    """Whitelisted `--flag value` / `--flag=value` pairs; every other argument is dropped."""
    args = [a.decode(errors="replace") for a in cmdline.split(b"\0") if a]
    found: dict[str, str] = {}
    for i, arg in enumerate(args):
        name, eq, inline = arg.partition("=")
        key = ALLOWED_FLAGS.get(name)
        if key is None:
            continue
        if eq:
            found[key] = inline
        elif i + 1 < len(args) and not args[i + 1].startswith("-"):
            found[key] = args[i + 1]
    return found


def parse_environ(raw: bytes) -> dict[str, str]:
    """Whitelisted variables only; other values are never decoded into strings."""
    kept: dict[str, str] = {}
    for entry in raw.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if not sep:
            continue
        decoded = name.decode(errors="replace")
        if decoded in ALLOWED_ENV:
            kept[decoded] = value.decode(errors="replace")
    return kept


def span_connections(spans: SpansSnapshot | None) -> frozenset[HeldConnection]:
    """The sending end of each span sender's last connection, as procfs would list it."""
    ends = (sending_end(held.connection) for held in (spans.senders if spans else ()))
    return frozenset(end for end in ends if end is not None)


class ProcfsSource(Source[ProcSnapshot]):
    """The GPU processes NVML reports, the engine processes while engines are scraped,
    and their ancestors."""

    key = PROCESSES
    # The engines' scrapes: only while there are targets are engine processes looked for;
    # the span receiver's senders: the connections they came over are looked for.
    needs = (NVML, ENGINES, SPANS)

    def __init__(self, proc_root: str = "/proc", socket_seconds: float = 1.0) -> None:
        self.root = Path(proc_root)
        self._root = str(self.root)
        # The API servers' listening sockets get this long, inside the source's deadline,
        # and so does the engine scan.
        self.socket_seconds = socket_seconds
        self._sockets = BoundSockets()

    def fetch(self, inputs: Snapshots) -> ProcSnapshot:
        nvml = inputs.get(NVML)
        engines = inputs.get(ENGINES)
        return self.read(
            nvml.pids() if nvml is not None else (),
            engines=engines is not None and bool(engines.scrapes),
            connections=span_connections(inputs.get(SPANS)),
        )

    def read(
        self,
        pids: Iterable[int],
        *,
        engines: bool = False,
        connections: frozenset[HeldConnection] = frozenset(),
    ) -> ProcSnapshot:
        """The processes `pids` and their ancestors; with `engines`, also every engine
        process (engine_pids) and its ancestors, its API server among them; and which API
        server holds each of `connections`."""
        if not self.root.is_dir():
            raise SourceError("proc_root_missing", f"proc root {str(self.root)!r} does not exist")
        found: dict[int, ProcessInfo] = {}
        wanted = sorted(set(pids))
        for pid in wanted:
            self._walk_up(pid, found)
        if engines:
            for pid in self.engine_pids(time.monotonic() + self.socket_seconds):
                self._walk_up(pid, found)
        if wanted and not any(pid in found for pid in wanted):
            # Not one GPU process is visible: the proc root is not the host's (no hostPID,
            # or hidepid). Say so rather than report every GPU as holding nobody's memory.
            raise SourceError(
                "pids_not_visible",
                f"none of the {len(wanted)} GPU processes NVML reports is under "
                f"{str(self.root)!r}: run with hostPID: true and --proc-root at the host's /proc",
            )
        # Which API server listens on which port: how each target finds its own server.
        deadline = time.monotonic() + self.socket_seconds
        sockets = self._sockets.read(self._root, api_servers(found), deadline, connections)
        return ProcSnapshot(processes=frozen_map(found), sockets=frozen_map(sockets))

    def engine_pids(self, deadline: float) -> list[int]:
        """PIDs whose title an engine kind set (`VLLM::EngineCore`, ...): at most
        MAX_ENGINE_PROCESSES of the first MAX_SCANNED /proc entries, read by `deadline`.
        Only the head of each cmdline is read, readable without SYS_PTRACE."""
        found: list[int] = []
        try:
            with os.scandir(self._root) as entries:
                for count, entry in enumerate(entries):
                    if count >= MAX_SCANNED or len(found) >= MAX_ENGINE_PROCESSES:
                        break
                    if count % 256 == 0 and time.monotonic() >= deadline:
                        log.debug("engine scan: deadline after %d /proc entries", count)
                        break
                    if not entry.name.isdigit():
                        continue
                    head = _read(f"{self._root}/{entry.name}/cmdline", _TITLE_HEAD)
                    if (
                        head
                        and head.startswith(_TITLE_BYTES)
                        and is_engine_title(parse_title(head))
                    ):
                        found.append(int(entry.name))
        except OSError:  # the proc root went away mid-scan: what was found stands
            pass
        return found

    def _walk_up(self, pid: int, found: dict[int, ProcessInfo]) -> None:
        current: int | None = pid
        for _ in range(MAX_ANCESTRY):
            if current is None or current <= 0 or current in found:
                return
            info = self.read_process(current)
            if info is None:
                return
            found[current] = info
            current = info.ppid

    def read_process(self, pid: int) -> ProcessInfo | None:
        """What /proc tells about `pid`; None when it is gone, also when it exits
        between the reads of its status and its cgroup."""
        base = f"{self._root}/{pid}"
        status = _read(f"{base}/status", _SMALL_FILE)
        if status is None:
            return None  # gone: nothing to say about it
        ppid, nspid = parse_status(status.decode(errors="replace"))
        cgroup = _read(f"{base}/cgroup", _SMALL_FILE)
        if cgroup is None and not os.path.exists(f"{base}/status"):
            # Exited between the two reads: which pod it was in is unknown, which is not
            # the same as "in no pod" (that would count its memory as the host's).
            return None
        cmdline = _read(f"{base}/cmdline", _SMALL_FILE) or b""
        environ = _read(f"{base}/environ", _ENVIRON_LIMIT)
        if environ is None:
            log.debug("pid %d: environ unreadable, device map from it unknown", pid)
        return ProcessInfo(
            pid=pid,
            ppid=ppid,
            nspid=nspid or (pid,),
            title=parse_title(cmdline),
            cgroup=parse_cgroup_file(cgroup.decode(errors="replace")) if cgroup else NO_IDENTITY,
            environ=frozen_map(parse_environ(environ or b"")),
            flags=frozen_map(parse_flags(cmdline)),
        )
