"""One request walked to the silicon, on the demo: its engine sends its spans to the
agent over OTLP/HTTP from the engine pod's address, the agent ties them to the engine,
and `explain --from URL --request ID` prints the request's timeline, the engine state
that explains its wait (max_num_seqs), the Serve router's part, and the engine's workers,
pods and GPUs; /ledger lists the slowest requests with a link, and the OpenMetrics
exposition carries the trace id as an exemplar, never as a label.

The demo's requests are shortened here (the same engine, the same requests, seconds
instead of tens of seconds) so that the sampled engine state falls inside the wait."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO
from tests.security.helpers import Served, get, gpuledger

DEMO = REPO / "exporter" / "gpuledger" / "sim" / "scenarios" / "demo.yaml"


def quick_demo(path: Path) -> Path:
    doc: dict[str, Any] = yaml.safe_load(DEMO.read_text())
    (server,) = doc["engines"]
    server["requests"] = [
        {"id": "req-101", "after": "0.2s", "queue": 0.0001, "prefill": 0.03, "decode": 0.3},
        {"id": "req-102", "after": "0.3s", "queue": "2.5s", "prefill": 0.04, "decode": 0.4},
        {"id": "req-103", "after": "0.4s", "queue": "2s", "decode": 0.2, "router": True},
    ]
    path.write_text(yaml.safe_dump({**doc, "phases": []}))
    return path


def all_sent(doc: dict[str, Any]) -> bool:
    return sum(len(s["recent"]) for s in doc["spans"]["senders"]) == 3


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    scenario = quick_demo(tmp_path_factory.mktemp("demo") / "demo.yaml")
    served = Served(["simulate", str(scenario), "--interval", "0.3"])
    try:
        served.wait(all_sent)
        yield served
    finally:
        served.close()
        served.remove_log()


def explain(agent: Served, *query: str) -> str:
    result = gpuledger("explain", "--from", agent.base, *query)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_a_request_that_waited_at_max_num_seqs_is_walked_down_to_its_gpus(agent: Served) -> None:
    text = explain(agent, "--request", "req-102")
    assert "request cmpl-req-102-0" in text
    assert "tied by the sender's pod IP + the API server's NSpid" in text
    assert re.search(r"scheduled\s+\+2\.50 s\s+\(queued 2\.50 s\)", text), text
    assert "waited: in the engine's queue, before it was scheduled" in text
    assert re.search(r"during the wait .*48 running of max_num_seqs 48.* -> max_num_seqs", text)
    assert "why it waited: max_num_seqs" in text
    assert "process 41020 VLLM::Worker_TP0  holds cuda:0 = GPU-f75c9cdb" in text
    assert "pod llm/llama-8b-5f7c9d8b6-q7x2k" in text


def test_a_request_through_the_serve_router_shows_the_routers_part(agent: Served) -> None:
    text = explain(agent, "--request", "req-103")
    assert re.search(
        r"router ray-serve-proxy proxy_http_request on demo-gpu-node-1: started 4\.0 ms "
        r"before the engine saw it",
        text,
    ), text
    untraced = explain(agent, "--request", "req-101")
    assert "router: no router span in this trace was received" in untraced
    assert "waited: not in the engine's queue" in untraced


def test_the_json_names_the_rule_the_reason_and_the_trace(agent: Served) -> None:
    result = gpuledger("explain", "--from", agent.base, "--request", "req-102", "--output", "json")
    (shown,) = json.loads(result.stdout)["requests"]
    assert (shown["joined_by"], shown["reason"], shown["waited_in"]) == (
        "peer_pod",
        "max_num_seqs",
        "engine_queue",
    )
    by_trace = explain(agent, "--request", shown["request"]["trace_id"])
    assert "request cmpl-req-102-0" in by_trace


def test_an_unknown_request_is_not_recorded_not_guessed(agent: Served) -> None:
    result = gpuledger("explain", "--from", agent.base, "--request", "req-999")
    assert result.returncode == 1
    assert "request 'req-999' not recorded on demo-gpu-node-1" in result.stderr


def test_the_page_lists_the_slowest_requests_and_links_each(agent: Served) -> None:
    status, page = get(agent.base + "/ledger")
    assert status == 200
    table = page.split('id="requests"', 1)[1]
    assert table.index("cmpl-req-102-0") < table.index("cmpl-req-101-0")
    status, one = get(agent.base + "/ledger?request=cmpl-req-102-0")
    assert status == 200 and "why it waited: max_num_seqs" in one


def test_histograms_carry_the_trace_id_as_an_exemplar_never_as_a_label(agent: Served) -> None:
    request = urllib.request.Request(
        agent.base + "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        exposition = resp.read().decode()
    doc = json.loads(get(agent.base + "/ledger.json")[1])
    traces = {r["trace_id"] for s in doc["spans"]["senders"] for r in s["recent"]}
    queue = [
        ln for ln in exposition.splitlines() if ln.startswith("gpuledger_engine_request_queue")
    ]
    exemplars = {m for ln in queue for m in re.findall(r'# \{trace_id="([0-9a-f]{32})"\}', ln)}
    assert exemplars and exemplars <= traces
    labels = " ".join(ln.split(" # ")[0] for ln in exposition.splitlines())
    assert not any(t in labels for t in traces)
    assert "cmpl-req-" not in exposition
