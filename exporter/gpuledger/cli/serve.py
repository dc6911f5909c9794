"""`gpuledger serve`: the exporter, node agent or cluster view."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import ssl
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from gpuledger.cli.flags import (
    DEFAULT_PODRESOURCES,
    EXIT_USAGE,
    _list,
    agent_access,
    prometheus_access,
)
from gpuledger.explain.agents import (
    AgentAccessError,
)
from gpuledger.identity.urls import safe_url
from gpuledger.model.spans import GrpcSecurity
from gpuledger.pipeline import Pipeline, PipelineConfig
from gpuledger.web import cluster_page
from gpuledger.web.fleet_page import FleetPage
from gpuledger.web.server import (
    OTLP_TRACES_PATH,
    Exporter,
    LedgerPage,
    node_ledger_page,
    parse_listen,
    serve,
)
from gpuledger.web.webconfig import WebConfig, WebConfigError, load_web_config

if TYPE_CHECKING:
    from gpuledger.sim.harness import PhaseClock

log = logging.getLogger("gpuledger")


def _install_signal_handlers(stop: threading.Event) -> None:
    def handle(_signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)


def run_exporter(
    config: PipelineConfig,
    args: argparse.Namespace,
    banner: str | None = None,
    on_tick: PhaseClock | None = None,
) -> int:
    web = None
    if getattr(args, "web_config_file", None):
        try:
            web = load_web_config(args.web_config_file)
        except WebConfigError as exc:
            print(f"gpuledger: error: --web-config-file: {exc}", file=sys.stderr)
            return 2
    ledger_page: LedgerPage = node_ledger_page
    if config.mode == "cluster":
        cluster = cluster_ledger_page(config, args)
        if cluster is None:
            return EXIT_USAGE
        ledger_page = cluster
    pipeline = Pipeline(config)
    exporter = Exporter(
        pipeline.cycle,
        args.interval,
        lambda: pipeline.warm_up(config.source_deadline_seconds),
        simulated=config.simulated,
    )
    try:
        httpd = serve(
            exporter,
            args.listen,
            config.node,
            config.mode,
            web,
            ledger_page=ledger_page,
            spans=pipeline.span_sink,
        )
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        print(f"gpuledger: error: cannot listen on {args.listen}: {reason}", file=sys.stderr)
        return 2
    if config.otlp_grpc_listen and start_span_grpc(pipeline, config.otlp_grpc_listen, web) is None:
        httpd.server_close()
        return 2
    stop = threading.Event()
    _install_signal_handlers(stop)
    exporter.start()
    # serve_forever polls for shutdown; once a second is enough (0.5 s by default).
    accept = threading.Thread(target=httpd.serve_forever, args=(1.0,), name="http", daemon=True)
    accept.start()
    host, port = httpd.server_address[:2]
    scheme = "https" if web is not None and web.tls is not None else "http"
    log.info(
        "serving on %s://%s:%s/ (node %s, mode %s)", scheme, host, port, config.node, config.mode
    )
    if banner:
        print(banner.format(url=f"http://localhost:{port}"), flush=True)
    if on_tick is not None:  # the simulator's engines send their spans here
        local = str(host) if host not in ("0.0.0.0", "::", "") else "127.0.0.1"
        on_tick.serving(
            f"http://{local}:{port}" if ":" not in local else f"http://[{local}]:{port}"
        )
    # A signal sets `stop` at once; the wait's period only paces the simulator's ticks.
    while not stop.wait(0.5 if on_tick is not None else 5.0):
        if on_tick is not None:
            on_tick.tick()
    httpd.shutdown()
    httpd.server_close()
    exporter.stop()
    pipeline.close()
    return 0


def grpc_security(web: WebConfig | None) -> GrpcSecurity:
    """The web config's TLS and basic auth, for the OTLP/gRPC listener."""
    if web is None:
        return GrpcSecurity(authorized=lambda _authorization: True)
    files = web.tls.files if web.tls is not None else None
    return GrpcSecurity(
        authorized=lambda authorization: web.authorized(OTLP_TRACES_PATH, authorization),
        cert_file=str(files.cert_file) if files else None,
        key_file=str(files.key_file) if files else None,
        client_ca_file=str(files.client_ca_file) if files and files.client_ca_file else None,
        require_client_cert=files is not None and files.verify_mode == ssl.CERT_REQUIRED,
    )


def start_span_grpc(pipeline: Pipeline, listen: str, web: WebConfig | None) -> int | None:
    """Starts OTLP/gRPC on `listen`; its port, or None after saying why it cannot."""
    try:
        port = pipeline.start_span_grpc(parse_listen(listen), grpc_security(web))
    except (RuntimeError, ValueError, OSError) as exc:
        print(f"gpuledger: error: --otlp-grpc-listen {listen}: {exc}", file=sys.stderr)
        return None
    if not port:
        print(f"gpuledger: error: cannot listen on {listen} (OTLP/gRPC)", file=sys.stderr)
        return None
    return port


def cluster_ledger_page(config: PipelineConfig, args: argparse.Namespace) -> LedgerPage | None:
    """The cluster view's /ledger: with --prometheus-url, the fleet page (every workload
    from the recording rules, the agents of the one opened); else the agents of
    --agent-url, and those the Kubernetes API lists when it is on, read as the --agent-*
    flags say. None (after saying why) for a bad
    --agent-url or an --agent-ca-file or --agent-auth-file that cannot be used."""
    urls = _list(getattr(args, "agent_url", None), "AGENT_URLS")
    for url in urls:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            print(
                f"gpuledger: error: --agent-url {url!r}: expected http(s)://HOST:PORT",
                file=sys.stderr,
            )
            return None
    access = agent_access(args)
    try:
        access.credentials()  # checked once here; re-read on each refresh of the page
    except AgentAccessError as exc:
        print(f"gpuledger: error: {exc}", file=sys.stderr)
        return None
    prometheus = prometheus_access(args)
    if prometheus is not None:
        try:
            prometheus.client(config.source_deadline_seconds)  # the files, checked once
        except AgentAccessError as exc:
            print(f"gpuledger: error: {exc}", file=sys.stderr)
            return None
        return FleetPage(prometheus, deadline_seconds=config.source_deadline_seconds, access=access)
    return cluster_page.for_cluster_view(
        urls,
        kubernetes=config.kubernetes,
        kubeconfig=config.kubeconfig,
        deadline_seconds=config.source_deadline_seconds,
        access=access,
    )


def ray_workload(address: str | None, explicit: str | None) -> tuple[str, str]:
    """(namespace, workload) for cluster-mode Ray series."""
    if explicit:
        namespace, _, name = explicit.rpartition("/")
        return namespace, name
    host = (address or "").split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0]
    first, _, rest = host.partition(".")
    if first.endswith("-head-svc"):
        # KubeRay names the head service <cluster>-head-svc in the cluster's namespace.
        return rest.split(".", 1)[0] if rest else "", first.removesuffix("-head-svc")
    return "", "ray"


def _read_token(path: str | None, flag: str = "--ray-token-file") -> str | None:
    if not path:
        return None
    try:
        return Path(path).read_text().strip() or None
    except OSError as exc:
        # The path is a flag value; the file's content never appears in a message.
        print(f"gpuledger: error: cannot read {flag} {path}: {exc.strerror}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None


def picker_urls(values: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """--gateway-picker-url NAMESPACE/POOL=URL values; a malformed one is a usage error."""
    pairs = []
    for value in values:
        pool, _, url = value.partition("=")
        namespace, _, name = pool.partition("/")
        if not (namespace and name and "/" not in name) or not url.startswith(
            ("http://", "https://")
        ):
            print(
                "gpuledger: error: --gateway-picker-url takes NAMESPACE/POOL=URL with an "
                f"http:// or https:// URL, got {safe_url(url) if url else pool!r}",
                file=sys.stderr,
            )
            raise SystemExit(EXIT_USAGE)
        pairs.append((pool, url))
    return tuple(pairs)


def serve_config(args: argparse.Namespace) -> PipelineConfig:
    kubernetes = args.kubernetes == "on" or (
        args.kubernetes == "auto"
        and (bool(args.kubeconfig) or "KUBERNETES_SERVICE_HOST" in os.environ)
    )
    socket_path = args.podresources_socket
    if socket_path is None:
        socket_path = DEFAULT_PODRESOURCES if kubernetes else ""
    return PipelineConfig(
        node=args.node_name,
        mode=args.mode,
        proc_root=args.proc_root,
        nvml_library=args.nvml_library,
        source_deadline_seconds=args.source_deadline,
        podresources_socket=socket_path or None,
        gpu_resources=_list(args.gpu_resource, "GPU_RESOURCES", "nvidia.com/gpu,nvidia.com/mig-*"),
        kubernetes=kubernetes,
        kubeconfig=args.kubeconfig,
        engine_targets=_list(args.vllm_target, "VLLM_TARGETS"),
        engine_discovery=args.vllm_discovery == "on",
        pending_all_pods=args.pending_all_pods,
        dra=kubernetes and args.dra == "auto",
        dra_device_classes=_list(
            args.dra_device_class, "DRA_DEVICE_CLASSES", "gpu.nvidia.com,mig.nvidia.com"
        ),
        dra_drivers=_list(args.dra_driver, "DRA_DRIVERS", "gpu.nvidia.com"),
        gateway=kubernetes and args.mode == "cluster" and args.gateway == "auto",
        gateway_picker_urls=picker_urls(_list(args.gateway_picker_url, "GATEWAY_PICKER_URLS")),
        gateway_picker_token=_read_token(
            args.gateway_picker_token_file, "--gateway-picker-token-file"
        ),
        gateway_picker_ca_file=args.gateway_picker_ca_file,
        ray_address=args.ray_address,
        ray_token=_read_token(args.ray_token_file),
        ray_workload=ray_workload(args.ray_address, args.ray_workload),
        otlp_receiver=args.mode == "node" and args.otlp_receiver == "on",
        otlp_grpc_listen=args.otlp_grpc_listen,
        otlp_max_body_bytes=args.otlp_max_body_bytes,
    )
