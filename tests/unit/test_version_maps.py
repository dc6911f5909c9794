"""The engine kinds' version maps (issue 25, item 5): one per kind, in its module, held to
every capture: each mapped name the capture's release should show is in it, and every name
a kind reads is mapped."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuledger.engines import KINDS
from gpuledger.engines.kinds import EngineKind, MetricName, Version
from gpuledger.engines.sglang import SGLANG
from gpuledger.engines.vllm import VLLM

ROOT = Path(__file__).resolve().parents[2]
SGLANG_FIXTURES = ROOT / "tests" / "fixtures" / "sglang"
VLLM_FIXTURES = ROOT / "tests" / "fixtures" / "vllm"

# Every capture of a real engine, with the kind and release that served (or rendered) it:
# the ../shared/reference captures are kept verbatim in tests/fixtures/vllm (README there).
CAPTURES: list[tuple[Path, EngineKind, Version]] = [
    *(
        (VLLM_FIXTURES / name, VLLM, (0, 32))
        for name in (
            "vllm-0.32.txt",  # ../shared/reference/vllm-0.32-cpu/metrics.txt
            "vllm-0.32-otlp-after.txt",
            "vllm-0.32-ray-under-load-1.txt",
            "vllm-0.32-ray-under-load-2.txt",
        )
    ),
    (SGLANG_FIXTURES / "sglang-0.5.23.txt", SGLANG, (0, 5, 23)),
    (SGLANG_FIXTURES / "sglang-0.5.23-priority-dp1.txt", SGLANG, (0, 5, 23)),
]


def _shown(text: str, name: str) -> bool:
    """A sample of the family (any suffix a counter or histogram adds)."""
    return (
        re.search(rf"^{re.escape(name)}(?:_total|_bucket|_count|_sum)?[{{ ]", text, re.M)
        is not None
    )


@pytest.mark.parametrize(
    ("path", "kind", "version"),
    CAPTURES,
    ids=[str(c[0].relative_to(ROOT.parent)) for c in CAPTURES],
)
def test_every_name_the_release_shows_is_in_its_capture(
    path: Path, kind: EngineKind, version: Version
) -> None:
    text = path.read_text()
    missing = [
        n.name for n in kind.names_shown(version) if not n.after_event and not _shown(text, n.name)
    ]
    assert missing == []
    # And what the map says is gone is gone.
    gone = [n.name for n in kind.versions if n.status(version) != "shown" and _shown(text, n.name)]
    assert gone == []


def test_every_reference_capture_is_checked() -> None:
    assert len([c for c in CAPTURES if c[1] is VLLM]) == 4
    assert all(path.is_file() for path, _, _ in CAPTURES)


@pytest.mark.parametrize("kind", KINDS, ids=[k.name for k in KINDS])
def test_every_name_a_kind_reads_is_in_its_map(kind: EngineKind) -> None:
    mapped = {n.name for n in kind.versions}
    native = kind.metrics[0]
    read = {native.running, native.waiting, *native.kv_usage, native.cache_config}
    read |= {native.waiting_by_reason} | {n for n in native.preemptions if n.endswith("_total")}
    assert read - {""} - mapped == set()


def test_the_deprecation_rule_hidden_one_release_then_removed() -> None:
    old = MetricName("vllm:gpu_cache_usage_perc", deprecated=(0, 10))
    assert [old.status(v) for v in ((0, 9), (0, 10), (0, 11), (0, 12), (1, 0))] == [
        "shown",
        "shown",
        "hidden",
        "removed",
        "removed",
    ]
    assert MetricName("x", since=(0, 20)).status((0, 19)) == "absent"


def test_vllm_kv_usage_names_by_release() -> None:
    def kv(version: Version) -> list[str]:
        return [n.name for n in VLLM.names_shown(version) if "cache_usage" in n.name]

    assert kv((0, 9)) == ["vllm:gpu_cache_usage_perc"]
    assert kv((0, 10)) == ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"]
    assert kv((0, 32)) == ["vllm:kv_cache_usage_perc"]
