"""CPU of parsing one vLLM exposition: the real 0.32 sample, and hostile bodies.

Each hostile body is as large as a scrape may be (8 MiB, the default body cap), so its
time is the most one hostile engine can cost a cycle.

    .venv/bin/python benchmarks/bench_parse.py [--repeat 200]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "exporter"))

from gpuledger.sources.engines.exposition import ExpositionError, parse_exposition

BODY = 8 * 1024 * 1024
RUNNING = "vllm:num_requests_running"


def _lines(line: str) -> str:
    """`line` repeated to fill a body."""
    return (line + "\n") * (BODY // (len(line) + 1))


def hostile_bodies() -> dict[str, str]:
    return {
        "one 8 MiB line of escaped quotes": f'{RUNNING}{{a="' + '\\"' * (BODY // 2) + '"} 1\n',
        "one 8 MiB line of labels": RUNNING
        + "{"
        + "".join(f'a{i}="",' for i in range(BODY // 12))
        + "} 1\n",
        "16 KiB lines of escaped quotes": _lines(f'{RUNNING}{{a="' + '\\"' * 8192 + '"} 1'),
        "4 KiB lines of escaped quotes": _lines(f'{RUNNING}{{a="' + '\\"' * 2048 + '"} 1'),
        # Just under the parser's bounds (when it has them): the most prometheus_client parses.
        "480 KiB of 4 KiB lines of escaped quotes, then other lines": (
            (f'{RUNNING}{{a="' + '\\"' * 2000 + '"} 1\n') * 120
        )
        + 'other_metric{engine="0"} 1\n' * ((BODY - 120 * 4040) // 27),
        "short wanted lines": _lines(f'{RUNNING}{{engine="0",model_name="m"}} 1'),
        "short other lines": _lines('other_metric{engine="0",model_name="m"} 1'),
    }


def seconds(parse: Callable[[str], object], text: str) -> float:
    started = time.process_time()
    with contextlib.suppress(ExpositionError):
        parse(text)
    return time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    sample = (ROOT / "tests" / "fixtures" / "vllm" / "vllm-0.32.txt").read_text()
    times = [seconds(parse_exposition, sample) for _ in range(args.repeat)]
    result = {"real_0.32_sample_us": statistics.median(times) * 1e6}
    for name, body in hostile_bodies().items():
        result[f"{name}_s"] = seconds(parse_exposition, body)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
