"""The engine kinds gpuledger reads, and what holds for all of them. Pure.

Adding a kind is one module beside vllm.py and its line in KINDS.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuledger.engines.kinds import EngineKind, EngineProcess, RayExecutor
from gpuledger.engines.sglang import SGLANG
from gpuledger.engines.vllm import VLLM

# The first is the default of what names no kind (the scenario format's alias); a body
# showing several kinds' series is the first's.
KINDS: tuple[EngineKind, ...] = (VLLM, SGLANG)
BY_NAME: Mapping[str, EngineKind] = {k.name: k for k in KINDS}
# Every engine's retitled processes start with one of these.
TITLE_PREFIXES: tuple[str, ...] = tuple(k.title_prefix for k in KINDS)
# The simulator's Ray-executor engine when a scenario names none: its driver's title.
DEFAULT_RAY: RayExecutor = next(k.ray for k in KINDS if k.ray is not None)
DEFAULT_RAY_DRIVER = DEFAULT_RAY.driver


def is_engine_title(title: str) -> bool:
    """A process an engine retitled (EngineCore, Worker, ...), not its API server."""
    return title.startswith(TITLE_PREFIXES)


def parse_engine_title(title: str, pid: int = 0) -> EngineProcess | None:
    """The engine process a title names, of whichever kind; None for other titles."""
    if not is_engine_title(title):
        return None
    for kind in KINDS:
        found = kind.parse_title(title, pid)
        if found is not None:
            return found
    return None


def flag_whitelist() -> dict[str, str]:
    """Every kind's whitelisted API-server flags -> configuration key. Raises when two
    kinds read one flag as different keys (the command line is read before its kind is
    known)."""
    found: dict[str, str] = {}
    for kind in KINDS:
        for flag, key in kind.flags.items():
            if found.setdefault(flag, key) != key:
                raise ValueError(f"{flag} is {found[flag]} and {key}")
    return found


__all__ = [
    "BY_NAME",
    "DEFAULT_RAY",
    "DEFAULT_RAY_DRIVER",
    "KINDS",
    "TITLE_PREFIXES",
    "EngineKind",
    "EngineProcess",
    "flag_whitelist",
    "is_engine_title",
    "parse_engine_title",
]
