"""What an engine's own server-info endpoint says of its configuration (SGLang's
`/server_info`), whitelisted. Pure data: the engine kinds' parsers make it, the engine
source carries it in its scrapes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuledger.model.base import frozen_map


@dataclass(frozen=True)
class ServerInfo:
    """`config` under the generic configuration keys (as strings, as flags are), and the
    batch-slot bound its schedulers actually use (`max_num_seqs`, after they fitted it to
    the KV pool), when they all agree."""

    config: Mapping[str, str] = field(default_factory=frozen_map)
    effective_max_num_seqs: str | None = None
