"""The span receiver under a flood (docs/performance.md, "The span receiver's budget").

    PYTHONPATH=exporter .venv/bin/python -m benchmarks.bench_spans

1. What one held span costs (tracemalloc), and what the store holds after 200,000 spans
   from 64 senders and 10,000 made-up ones: within store.budget_bytes() whatever arrives.
2. Parsing the real capture (spans per second of one core).
3. A flood over HTTP into a real agent's server (16 clients sending 4 MiB bodies as fast
   as they are answered, 8 sending 50 MB heads, while 16 more trickle bodies) and its
   /metrics scrape latency then, against the same server idle; the process's peak RSS.
4. The same flood against a real `gpuledger serve --otlp-receiver on`: its RSS and scrapes.
"""

from __future__ import annotations

import multiprocessing
import resource
import socket
import statistics
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from benchmarks.scrape_latency import Scraper
from gpuledger.model.spans import EngineRequestSpan, SpanSender
from gpuledger.pipeline import Pipeline, PipelineConfig
from gpuledger.sources.otlp.decode import decode, parse_protobuf
from gpuledger.sources.otlp.receiver import OtlpReceiver
from gpuledger.sources.otlp.store import SpanStore, budget_bytes
from gpuledger.web.server import Exporter, serve

CAPTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "vllm-otlp"


def _span(n: int) -> EngineRequestSpan:
    return EngineRequestSpan(
        trace_id=f"{n:032x}",
        span_id=f"{n:016x}",
        parent_span_id=f"{n + 1:016x}",
        request_id=f"cmpl-req-{n:012d}-0",
        start_ns=1_796_000_000_000_000_000 + n,
        end_ns=1_796_000_001_000_000_000 + n,
        queue_seconds=n % 7 / 3,
        ttft_seconds=0.1,
        e2e_seconds=n % 11 / 2,
        prefill_seconds=0.01,
        decode_seconds=0.5,
        inference_seconds=0.51,
        prompt_tokens=n % 4096,
        completion_tokens=n % 512,
        max_tokens=512,
    )


def store_memory() -> None:
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    spans = [_span(n) for n in range(10_000)]
    per_span = (tracemalloc.get_traced_memory()[0] - before) / len(spans)
    del spans
    store = SpanStore()
    base = tracemalloc.get_traced_memory()[0]
    senders = [SpanSender(f"10.0.0.{i}", "vllm", f"i-{i}", i) for i in range(64)]
    for n in range(200_000):
        store.add([(senders[n % 64], _span(n))], [])
    store.add([(SpanSender("10.9.9.9", "x", f"f{n}", n), _span(n)) for n in range(10_000)], [])
    held = tracemalloc.get_traced_memory()[0] - base
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    print(f"one held span: {per_span:.0f} B (store.SPAN_BYTES is the estimate)")
    print(
        f"store after 200,000 spans from 64 senders + 10,000 new senders: {held / 1e6:.2f} MB "
        f"(peak {peak / 1e6:.2f} MB; budget {budget_bytes() / 1e6:.2f} MB; estimate "
        f"{store.snapshot().stored_bytes / 1e6:.2f} MB)"
    )


def parse_rate() -> None:
    bodies = [p.read_bytes() for p in sorted(CAPTURE.glob("otlp_http_*.pb"))]
    message = ExportTraceServiceRequest()
    for body in bodies:
        message.MergeFromString(body)
    big = message.SerializeToString()
    spans = sum(len(s.spans) for r in message.resource_spans for s in r.scope_spans)
    rounds = 2000
    started = time.perf_counter()
    for _ in range(rounds):
        decode(parse_protobuf(big), "10.0.0.1")
    seconds = time.perf_counter() - started
    print(f"parse + decode: {rounds * spans / seconds:,.0f} spans/s ({len(big)} B per request)")


def _flood(port: int, stop: threading.Event, body: bytes, kind: str) -> None:
    head = b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                if kind == "huge":
                    sock.sendall(head + b"Content-Length: 52428800\r\n\r\n" + b"\0" * 65536)
                elif kind == "trickle":
                    sock.sendall(head + f"Content-Length: {len(body)}\r\n\r\n".encode() + body[:10])
                    stop.wait(2)
                    continue
                else:
                    sock.sendall(head + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
                while sock.recv(65536):
                    pass
        except OSError:
            pass


def _flooder(port: int, body: bytes) -> None:
    stop = threading.Event()
    clients = [("full", 16), ("huge", 8), ("trickle", 16)]
    threads = [
        threading.Thread(target=_flood, args=(port, stop, body, kind), daemon=True)
        for kind, count in clients
        for _ in range(count)
    ]
    for t in threads:
        t.start()
    stop.wait()


def flood_and_scrape() -> None:
    pipeline = Pipeline(PipelineConfig(node="n1"), sources=[])
    exporter = Exporter(pipeline.cycle, 10.0)
    exporter.run_once()
    receiver = OtlpReceiver(SpanStore())
    httpd = serve(exporter, "127.0.0.1:0", "n1", "node", spans=receiver)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    port = int(httpd.server_address[1])
    with Scraper(port, 300) as idle:
        while not idle.done():
            time.sleep(0.05)
    one = (CAPTURE / "otlp_http_5.pb").read_bytes()
    big = one * (4 * 1024 * 1024 // len(one) - 1)  # concatenated messages merge: one message
    # The flood runs in a process of its own (as the engines do), so its threads never
    # compete with the agent for the GIL: what is measured is the agent's own cost.
    flooder = multiprocessing.get_context("fork").Process(target=_flooder, args=(port, big))
    flooder.start()
    time.sleep(1)
    with Scraper(port, 300) as flooded:
        while not flooded.done():
            time.sleep(0.05)
    flooder.terminate()
    flooder.join()
    snapshot = receiver.store.snapshot()
    httpd.shutdown()
    httpd.server_close()
    for name, runs in (("idle", idle.seconds), ("during the flood", flooded.seconds)):
        ordered = sorted(runs)
        p99 = ordered[int(len(ordered) * 0.99) - 1]
        print(
            f"/metrics {name}: median {statistics.median(runs) * 1000:.1f} ms, "
            f"p99 {p99 * 1000:.1f} ms, max {ordered[-1] * 1000:.1f} ms ({len(runs)} scrapes)"
        )
    print(f"refused during the flood: {dict(snapshot.refused_total)}")
    print(f"held: {snapshot.stored_bytes / 1e6:.2f} MB estimated")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS of the agent's process (the store benchmark included): {peak:.0f} MiB")


def _vm(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) // 1024
    return 0


def real_agent_rss(seconds: float = 20.0) -> None:
    """A real `gpuledger serve --otlp-receiver on` flooded as above: its RSS before and
    its peak (VmHWM) after."""
    port = _free_port()
    agent = subprocess.Popen(
        [sys.executable, "-m", "gpuledger", "serve", "--listen", f"127.0.0.1:{port}",
         "--otlp-receiver", "on", "--kubernetes", "off", "--vllm-discovery", "off",
         "--nvml-library", "/nonexistent/libnvidia-ml.so.1", "--interval", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        time.sleep(3)
        before = _vm(agent.pid, "VmRSS")
        one = (CAPTURE / "otlp_http_5.pb").read_bytes()
        big = one * (4 * 1024 * 1024 // len(one) - 1)
        flooder = multiprocessing.get_context("fork").Process(target=_flooder, args=(port, big))
        flooder.start()
        with Scraper(port, 200) as scraped:
            time.sleep(seconds)
        flooder.terminate()
        flooder.join()
        runs = sorted(scraped.seconds)
        print(
            f"real agent: RSS {before} MiB idle, peak {_vm(agent.pid, 'VmHWM')} MiB after "
            f"{seconds:.0f} s of flood; scrapes median {statistics.median(runs) * 1000:.1f} ms, "
            f"max {runs[-1] * 1000:.1f} ms"
        )
    finally:
        agent.terminate()
        agent.wait(10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


if __name__ == "__main__":
    store_memory()
    parse_rate()
    flood_and_scrape()
    real_agent_rss()
