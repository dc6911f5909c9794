"""Every flag of every command, and the README's flag tables made from them."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import re
import socket
from collections.abc import Callable
from typing import Any, NoReturn
from urllib.parse import urlsplit

from gpuledger import __version__
from gpuledger.explain.agents import AgentAccess
from gpuledger.explain.prometheus import PrometheusAccess
from gpuledger.identity.urls import safe_url
from gpuledger.web.server import parse_listen

log = logging.getLogger("gpuledger")

DEFAULT_PODRESOURCES = "/var/lib/kubelet/pod-resources/kubelet.sock"


DEFAULT_LISTEN = ":9402"  # not taken by dcgm-exporter (9400) or nvidia_gpu_exporter (9835)


EXIT_USAGE = 2


class OneLineParser(argparse.ArgumentParser):
    """Bad flags: one line saying what is wrong, exit 2 (argparse prints the whole usage)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"GPULEDGER_{name}", default)


def _one_of(*choices: str) -> Callable[[str], str]:
    """A `type` that checks choices: argparse checks `choices` for flags only, but runs
    `type` on string defaults too, so a bad environment variable fails the same way."""

    def check(text: str) -> str:
        if text not in choices:
            raise argparse.ArgumentTypeError(
                f"invalid choice: {text!r} (choose from {', '.join(choices)}; "
                "the flag or its GPULEDGER_ variable)"
            )
        return text

    return check


def _env_flag(name: str) -> bool:
    """A true/false variable; anything else is a usage error, checked in main()."""
    return (_env(name) or "false").strip().lower() == "true"


BOOLEAN_VARIABLES = ("PENDING_ALL_PODS", "AGENT_TLS")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be greater than 0")
    return value


_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"


_DNS_NAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*$")


def _server_name(text: str) -> str:
    """A DNS name or an IP address: what a certificate's subjectAltName can carry."""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        if not _DNS_NAME.match(text):
            raise argparse.ArgumentTypeError(
                f"{text[:80]!r} is not a DNS name or an IP address"
            ) from None
    return text


def _listen(text: str) -> str:
    try:
        parse_listen(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _flag(
    p: argparse.ArgumentParser,
    flag: str,
    meaning: str,
    *,
    env: str | None,
    shown_default: str | None = None,
    **kwargs: Any,
) -> None:
    """Adds `flag`, its help composed from `meaning`, variable and default, and records the
    variable and the default as documented, for the README's table (`flag_reference`)."""
    suffix = [f"env GPULEDGER_{env}"] if env else []
    if shown_default:
        suffix.append(f"default {shown_default}")
    text = meaning + (f" ({'; '.join(suffix)})" if suffix else "")
    action = p.add_argument(flag, help=text.replace("%", "%%"), **kwargs)
    action.gpuledger_env = env  # type: ignore[attr-defined]
    action.gpuledger_default = shown_default  # type: ignore[attr-defined]
    action.gpuledger_meaning = meaning  # type: ignore[attr-defined]


def _add_exporter_flags(p: argparse.ArgumentParser, *, simulated: bool) -> None:
    """serve's flags, in the order of the README's table; demo and simulate take the first
    group only (the simulator provides every source)."""
    _add_run_flags(p)
    if simulated:
        return
    _add_node_flags(p)
    _add_dra_flags(p)
    _add_engine_flags(p)
    _add_span_flags(p)
    _add_ray_flags(p)
    _add_gateway_flags(p)
    _add_cluster_view_flags(p)


def _add_run_flags(p: argparse.ArgumentParser) -> None:
    """Every exporter's: where it listens, how often and how long sources may take, logs."""
    _flag(
        p,
        "--listen",
        "address to serve /metrics, /ledger, /ledger.json, /healthz and /readyz on, [HOST]:PORT",
        env="LISTEN",
        shown_default=DEFAULT_LISTEN,
        type=_listen,
        default=_env("LISTEN", DEFAULT_LISTEN),
    )
    _flag(
        p,
        "--interval",
        "seconds between snapshots; scrapes read the latest one",
        env="INTERVAL",
        shown_default="10",
        type=_positive_float,
        default=_env("INTERVAL", "10"),
    )
    _flag(
        p,
        "--source-deadline",
        "seconds one source may take per snapshot before it is reported down",
        env="SOURCE_DEADLINE",
        shown_default="5",
        type=_positive_float,
        default=_env("SOURCE_DEADLINE", "5"),
    )
    _flag(
        p,
        "--log-level",
        "debug, info, warning or error",
        env="LOG_LEVEL",
        shown_default="info",
        choices=["debug", "info", "warning", "error"],
        type=_one_of("debug", "info", "warning", "error"),
        default=_env("LOG_LEVEL", "info"),
    )
    _flag(
        p,
        "--log-format",
        "text or json (one object per line)",
        env="LOG_FORMAT",
        shown_default="text",
        choices=["text", "json"],
        type=_one_of("text", "json"),
        default=_env("LOG_FORMAT", "text"),
    )


def _add_node_flags(p: argparse.ArgumentParser) -> None:
    """What the node agent reads: mode, /proc, NVML, Kubernetes, PodResources, GPU resources."""
    _flag(
        p,
        "--mode",
        "node: DaemonSet agent for this node's GPUs; cluster: one-replica view of what is "
        "not placed",
        env="MODE",
        shown_default="node",
        choices=["node", "cluster"],
        type=_one_of("node", "cluster"),
        default=_env("MODE", "node"),
    )
    _flag(
        p,
        "--proc-root",
        "host /proc; run with hostPID so NVML's PIDs resolve",
        env="PROC_ROOT",
        shown_default="/proc",
        default=_env("PROC_ROOT", "/proc"),
    )
    _flag(
        p,
        "--nvml-library",
        "path of libnvidia-ml.so.1 to load instead of the system one",
        env="NVML_LIBRARY",
        default=_env("NVML_LIBRARY"),
    )
    _flag(
        p,
        "--kubernetes",
        "read pods from the Kubernetes API; auto: when running in a cluster or "
        "--kubeconfig is given",
        env="KUBERNETES",
        shown_default="auto",
        choices=["auto", "on", "off"],
        type=_one_of("auto", "on", "off"),
        default=_env("KUBERNETES", "auto"),
    )
    _flag(
        p,
        "--kubeconfig",
        "kubeconfig file for running outside the cluster",
        env="KUBECONFIG_PATH",
        default=_env("KUBECONFIG_PATH"),
    )
    _flag(
        p,
        "--podresources-socket",
        "kubelet PodResources socket, read when Kubernetes is on; empty disables",
        env="PODRESOURCES_SOCKET",
        shown_default=DEFAULT_PODRESOURCES,
        default=_env("PODRESOURCES_SOCKET"),
    )
    _flag(
        p,
        "--gpu-resource",
        "extended resource names that are GPUs, repeatable, trailing * as a prefix "
        "(the variable: comma-separated)",
        env="GPU_RESOURCES",
        shown_default="nvidia.com/gpu,nvidia.com/mig-*",
        action="append",
        default=None,
    )
    _flag(
        p,
        "--pending-all-pods",
        "cluster mode: report unplaced pods that request no GPU too (the variable: true)",
        env="PENDING_ALL_PODS",
        shown_default="false",
        action="store_true",
        default=_env_flag("PENDING_ALL_PODS"),
    )


def _add_dra_flags(p: argparse.ArgumentParser) -> None:
    """Kubernetes DRA (resource.k8s.io/v1): which drivers and device classes are GPUs."""
    _flag(
        p,
        "--dra",
        "Kubernetes DRA: read this node's ResourceSlices (node), or ResourceClaims and "
        "every node's ResourceSlices (cluster); on when Kubernetes is (auto) or off",
        env="DRA",
        shown_default="auto",
        type=_one_of("auto", "off"),
        default=_env("DRA", "auto"),
    )
    _flag(
        p,
        "--dra-device-class",
        "DRA device classes whose claims are GPUs, repeatable (the variable: comma-separated)",
        env="DRA_DEVICE_CLASSES",
        shown_default="gpu.nvidia.com,mig.nvidia.com",
        action="append",
        default=None,
    )
    _flag(
        p,
        "--dra-driver",
        "DRA drivers whose devices are GPUs, repeatable (the variable: comma-separated)",
        env="DRA_DRIVERS",
        shown_default="gpu.nvidia.com",
        action="append",
        default=None,
    )


def _add_engine_flags(p: argparse.ArgumentParser) -> None:
    """Which engines are scraped: static targets and discovery."""
    _flag(
        p,
        "--vllm-target",
        "a vLLM /metrics URL to scrape, repeatable, for engines outside Kubernetes "
        "(the variable: comma-separated)",
        env="VLLM_TARGETS",
        action="append",
        default=None,
        metavar="URL",
    )
    _flag(
        p,
        "--vllm-discovery",
        "scrape pods on this node annotated gpuledger.io/vllm-port or prometheus.io/port",
        env="VLLM_DISCOVERY",
        shown_default="on",
        choices=["on", "off"],
        type=_one_of("on", "off"),
        default=_env("VLLM_DISCOVERY", "on"),
    )


def _add_span_flags(p: argparse.ArgumentParser) -> None:
    """The OTLP span receiver (docs/spans.md): engines' request spans, off by default."""
    _flag(
        p,
        "--otlp-receiver",
        "node mode: receive request spans over OTLP/HTTP on --listen's POST /v1/traces "
        "(vLLM's --otlp-traces-endpoint, or a Collector's otlphttp exporter), behind the "
        "same --web-config-file",
        env="OTLP_RECEIVER",
        shown_default="off",
        choices=["on", "off"],
        type=_one_of("on", "off"),
        default=_env("OTLP_RECEIVER", "off"),
    )
    _flag(
        p,
        "--otlp-grpc-listen",
        "with --otlp-receiver on: also receive OTLP/gRPC on this [HOST]:PORT (e.g. :4317)",
        env="OTLP_GRPC_LISTEN",
        type=_listen,
        default=_env("OTLP_GRPC_LISTEN"),
        metavar="[HOST]:PORT",
    )
    _flag(
        p,
        "--otlp-max-body-bytes",
        "the largest span export request read, after gzip inflation; larger ones are "
        "refused unread (413)",
        env="OTLP_MAX_BODY_BYTES",
        shown_default="4194304",
        type=_positive_int,
        default=int(_env("OTLP_MAX_BODY_BYTES", "4194304") or "4194304"),
        metavar="BYTES",
    )


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def _add_ray_flags(p: argparse.ArgumentParser) -> None:
    """Where the Ray state API is and how to authenticate to it."""
    _flag(
        p,
        "--ray-address",
        "Ray dashboard URL for the state API, e.g. http://raycluster-head-svc.ml:8265",
        env="RAY_ADDRESS",
        default=_env("RAY_ADDRESS"),
        metavar="URL",
    )
    _flag(
        p,
        "--ray-token-file",
        "file holding the Ray auth token; Ray 2.60 enables token auth by default",
        env="RAY_TOKEN_FILE",
        default=_env("RAY_TOKEN_FILE"),
        metavar="PATH",
    )
    _flag(
        p,
        "--ray-workload",
        "cluster mode: the workload Ray's pending work belongs to; default derived from "
        "a KubeRay head service address (<cluster>-head-svc.<namespace>)",
        env="RAY_WORKLOAD",
        default=_env("RAY_WORKLOAD"),
        metavar="NS/NAME",
    )


def _add_gateway_flags(p: argparse.ArgumentParser) -> None:
    """Cluster mode: InferencePools (Gateway API Inference Extension) and their pickers."""
    _flag(
        p,
        "--gateway",
        "cluster mode: list InferencePools (inference.networking.k8s.io/v1) and read each "
        "pool's endpoint picker metrics; on when Kubernetes is (auto) or off",
        env="GATEWAY",
        shown_default="auto",
        type=_one_of("auto", "off"),
        default=_env("GATEWAY", "auto"),
    )
    _flag(
        p,
        "--gateway-picker-url",
        "a pool's picker metrics URL instead of its Service's http-metrics port, "
        "NAMESPACE/POOL=URL, repeatable (the variable: comma-separated)",
        env="GATEWAY_PICKER_URLS",
        action="append",
        default=None,
        metavar="NS/POOL=URL",
    )
    _flag(
        p,
        "--gateway-picker-token-file",
        "file holding the bearer token sent to pickers (and only to them): a service "
        "account that may get /metrics, never the exporter's own",
        env="GATEWAY_PICKER_TOKEN_FILE",
        default=_env("GATEWAY_PICKER_TOKEN_FILE"),
        metavar="PATH",
    )
    _flag(
        p,
        "--gateway-picker-ca-file",
        "CA bundle that signs pickers' metrics certificates (https picker URLs)",
        env="GATEWAY_PICKER_CA_FILE",
        default=_env("GATEWAY_PICKER_CA_FILE"),
        metavar="PATH",
    )


def _add_cluster_view_flags(p: argparse.ArgumentParser) -> None:
    """The cluster view's agents and how every endpoint is protected; the node label."""
    _flag(
        p,
        "--agent-url",
        "cluster mode: a node agent's base URL for the cluster page, repeatable, e.g. "
        "http://10.0.3.7:9402; with the Kubernetes API the agents are also found by the "
        "chart's labels (the variable: comma-separated)",
        env="AGENT_URLS",
        action="append",
        default=None,
        metavar="URL",
    )
    _add_agent_access_flags(p, serve=True)
    _add_prometheus_flags(p, serve=True)
    _flag(
        p,
        "--web-config-file",
        "TLS and basic auth for every endpoint but /healthz and /readyz, in the Prometheus "
        "exporter-toolkit's web config format (docs/security.md)",
        env="WEB_CONFIG_FILE",
        default=_env("WEB_CONFIG_FILE"),
        metavar="PATH",
    )
    _flag(
        p,
        "--node-name",
        "value of the node label",
        env="NODE_NAME",
        shown_default="$NODE_NAME, else the hostname",
        default=_env("NODE_NAME") or os.environ.get("NODE_NAME") or socket.gethostname(),
    )


def _add_agent_access_flags(p: argparse.ArgumentParser, *, serve: bool) -> None:
    """How the node agents are read when --web-config-file protects them (agents.AgentAccess):
    serve's for the cluster page (with variables), explain's for discovery and --from."""
    mode = "cluster mode: " if serve else ""
    urls = "--agent-url" if serve else "--from"
    _flag(
        p,
        "--agent-tls",
        f"{mode}the agents serve HTTPS (their --web-config-file has a tls_server_config): "
        + (
            "the ones found by their labels are read at https://POD_IP:PORT (the variable: true)"
            if serve
            else "read at https://POD_IP:PORT, or as https:POD:PORT through the pod proxy "
            "(the API server does not verify their certificate)"
        ),
        env="AGENT_TLS" if serve else None,
        shown_default="false" if serve else None,
        action="store_true",
        default=_env_flag("AGENT_TLS") if serve else False,
    )
    _flag(
        p,
        "--agent-ca-file",
        f"{mode}CA bundle to verify the agents' certificates (and those of https:// {urls} "
        "URLs) against instead of the system's CAs: the chain, and the name only with "
        "--agent-server-name (agents are read by pod IP, which certificates rarely name)",
        env="AGENT_CA_FILE" if serve else None,
        default=(_env("AGENT_CA_FILE") or None) if serve else None,
        metavar="PATH",
    )
    _flag(
        p,
        "--agent-server-name",
        f"{mode}a DNS name the agents' certificate must carry (as Prometheus' serverName), "
        "e.g. gpuledger.monitoring.svc",
        env="AGENT_SERVER_NAME" if serve else None,
        type=_server_name,
        default=(_env("AGENT_SERVER_NAME") or None) if serve else None,
        metavar="NAME",
    )
    _flag(
        p,
        "--agent-auth-file",
        f"{mode}file holding USER:PASSWORD, sent as basic auth to "
        + (
            "every node agent the cluster page reads"
            if serve
            else "the agents (direct reads and --from; the API server's pod proxy strips it: "
            "not with --via proxy)"
        ),
        env="AGENT_AUTH_FILE" if serve else None,
        default=(_env("AGENT_AUTH_FILE") or None) if serve else None,
        metavar="PATH",
    )


def _add_prometheus_flags(p: argparse.ArgumentParser, *, serve: bool) -> None:
    """Where the fleet's recording rules are read (explain/prometheus.py), and how."""
    mode = "cluster mode: " if serve else ""
    what = (
        "the cluster page lists every workload from the mixin's recording rules there and "
        "reads node agents only for the workload opened; unset: every agent is read"
        if serve
        else "with --workload: the agents holding the workload's series there are the ones "
        "read (instead of the Kubernetes API's pod list)"
    )
    _flag(
        p,
        "--prometheus-url",
        f"{mode}base URL of the Prometheus (or Thanos Query, Mimir) that scrapes the agents, "
        f"e.g. http://prometheus.monitoring:9090: {what}",
        env="PROMETHEUS_URL" if serve else None,
        type=_http_url,
        default=(_env("PROMETHEUS_URL") or None) if serve else None,
        metavar="URL",
    )
    for flag, env, meaning, metavar in (
        (
            "--prometheus-bearer-token-file",
            "PROMETHEUS_BEARER_TOKEN_FILE",
            "file holding the token sent as Authorization: Bearer to Prometheus, re-read "
            "on every query",
            "PATH",
        ),
        (
            "--prometheus-ca-file",
            "PROMETHEUS_CA_FILE",
            "CA bundle to verify Prometheus' certificate against instead of the system's CAs",
            "PATH",
        ),
    ):
        _flag(
            p,
            flag,
            mode + meaning,
            env=env if serve else None,
            default=(_env(env) or None) if serve else None,
            metavar=metavar,
        )
    _flag(
        p,
        "--prometheus-selector",
        f'{mode}label matchers every query adds, e.g. cluster="prod": one cluster of a '
        "Prometheus that holds several (Thanos, Mimir)",
        env="PROMETHEUS_SELECTOR" if serve else None,
        type=_label_matchers,
        default=(_env("PROMETHEUS_SELECTOR") or "") if serve else "",
        metavar="MATCHERS",
    )
    _flag(
        p,
        "--prometheus-server-name",
        f"{mode}a DNS name Prometheus' certificate must carry (also sent as SNI)",
        env="PROMETHEUS_SERVER_NAME" if serve else None,
        type=_server_name,
        default=(_env("PROMETHEUS_SERVER_NAME") or None) if serve else None,
        metavar="NAME",
    )


_MATCHER = r'\s*[A-Za-z_][A-Za-z0-9_]*\s*(=|!=|=~|!~)\s*"(?:[^"\\]|\\.)*"\s*'
_MATCHERS = re.compile(rf"^{_MATCHER}(,{_MATCHER})*$")


def _label_matchers(text: str) -> str:
    """PromQL label matchers without braces: `cluster="prod"`, `a="x", b=~"y.*"`."""
    if text and not _MATCHERS.match(text):
        raise argparse.ArgumentTypeError(
            f'{text[:80]!r}: expected label matchers such as cluster="prod"'
        )
    return text.strip()


def _http_url(text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query:
        raise argparse.ArgumentTypeError(
            f"{safe_url(text)!r}: expected http(s)://HOST:PORT[/PATH], no query"
        )
    if parts.username or parts.password:
        raise argparse.ArgumentTypeError(
            "no credentials in the URL: use --prometheus-bearer-token-file"
        )
    return text


def flag_reference(parser: argparse.ArgumentParser, command: str) -> list[str]:
    """The Markdown rows of `command`'s flags for README.md (checked by a test)."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    rows = ["| flag | variable | default | meaning |", "|---|---|---|---|"]
    for action in sub.choices[command]._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        flag = max(action.option_strings, key=len)
        if flag == "--help":
            continue
        env = getattr(action, "gpuledger_env", None)
        default = getattr(action, "gpuledger_default", None)
        if default is None and isinstance(action.default, str):
            default = action.default
        meaning = getattr(action, "gpuledger_meaning", action.help or "")
        rows.append(
            f"| `{flag}` | {f'`GPULEDGER_{env}`' if env else '—'} | "
            f"{f'`{default}`' if default else '—'} | {meaning.replace('|', '/')} |"
        )
    return rows


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="gpuledger",
        description="One ledger of every GPU: Kubernetes, Ray, vLLM and NVML joined on GPU UUID "
        "and Pod UID.",
    )
    parser.add_argument("--version", action="version", version=f"gpuledger {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)

    serve_p = sub.add_parser("serve", help="run the Prometheus exporter")
    _add_exporter_flags(serve_p, simulated=False)

    sim = sub.add_parser(
        "simulate", help="run the real exporter against a simulated node described in FILE"
    )
    sim.add_argument("file", help="scenario file (YAML, see docs/scenarios.md)")
    sim.add_argument("--once", action="store_true", help="print one exposition and exit")
    sim.add_argument("--phase", help="with --once: render the scenario at this phase")
    _add_exporter_flags(sim, simulated=True)

    demo = sub.add_parser("demo", help="serve a bundled scenario: an 8-GPU simulated node")
    demo.add_argument("--once", action="store_true", help="print one exposition and exit")
    _add_exporter_flags(demo, simulated=True)
    ex = sub.add_parser(
        "explain",
        help="print the object chain and where the work waits, for a pod, GPU, workload or engine",
        description="Finds the node agents of the pods asked about and the cluster view "
        "through the Kubernetes API (kubeconfig or in-cluster) and reads their /ledger.json; "
        "or reads the exporters given (--from, repeatable), or runs a scenario (--scenario). "
        "Exit codes: 0 explained, 1 nothing matched, 2 usage error, 3 no source could be read "
        "(or the Kubernetes API could not be used).",
    )
    ex.add_argument(
        "--from",
        dest="sources",
        action="append",
        metavar="URL",
        default=[],
        help="an exporter's base URL, e.g. http://10.0.3.7:9402 (repeatable)",
    )
    _add_discovery_flags(ex)
    _add_agent_access_flags(ex, serve=False)
    _add_prometheus_flags(ex, serve=False)
    ex.add_argument("--scenario", metavar="FILE", help="explain a simulated scenario instead")
    ex.add_argument("--phase", help="with --scenario: at this phase")
    what = ex.add_mutually_exclusive_group(required=True)
    what.add_argument("--pod", metavar="NS/NAME", help="a pod: its chain and verdict")
    what.add_argument("--gpu", metavar="UUID", help="a GPU UUID or an unambiguous prefix")
    what.add_argument(
        "--workload",
        metavar="NS/NAME",
        help="a workload (Deployment, RayCluster, …): all its pods; NAME alone: a bare "
        "host's (its engine's systemd unit)",
    )
    what.add_argument(
        "--engine",
        metavar="NS/POD[:RANK]|MODEL|TARGET",
        help="a vLLM engine: by pod and DP rank, model (with or without its org/), "
        "target HOST:PORT, or a bare host's workload (its systemd unit)",
    )
    what.add_argument(
        "--pool",
        metavar="NS/NAME",
        help="a Gateway API InferencePool: its picker, its endpoints and the workloads "
        "behind them (the cluster view reads pools)",
    )
    what.add_argument(
        "--request",
        metavar="ID|TRACE_ID",
        help="one request, from the spans the agents received: its X-Request-Id "
        "(req-101), vLLM's id (cmpl-req-101-0) or its trace id",
    )
    ex.add_argument(
        "--output", choices=["text", "json"], default="text", help="text for people, json for tools"
    )
    ex.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        default="warning",
        help=argparse.SUPPRESS,
    )
    ex.add_argument(
        "--log-format", choices=["text", "json"], default="text", help=argparse.SUPPRESS
    )
    return parser


def _add_discovery_flags(p: argparse.ArgumentParser) -> None:
    """How explain finds the agents by itself when no --from is given (docs/explain.md)."""
    _flag(
        p,
        "--kubeconfig",
        "kubeconfig for finding the agents; without it: in-cluster when a service account is "
        "mounted, else $KUBECONFIG or ~/.kube/config",
        env=None,
        metavar="PATH",
    )
    _flag(p, "--context", "the kubeconfig context to use", env=None, shown_default="current")
    _flag(
        p,
        "--agents-namespace",
        "the namespace gpuledger runs in; default: every namespace, by the chart's labels",
        env=None,
        metavar="NS",
    )
    _flag(
        p,
        "--via",
        "proxy: read the agents through the API server's pods/proxy (from a laptop); direct: "
        "at their pod IPs (in the cluster)",
        env=None,
        shown_default="direct in-cluster, else proxy",
        type=_one_of("proxy", "direct"),
    )
    _flag(
        p,
        "--timeout",
        "seconds for reading every agent's /ledger.json, all reads together, and for each "
        "Kubernetes API request",
        env=None,
        shown_default="10",
        type=_positive_float,
        default=10.0,
        metavar="SECONDS",
    )


def _list(flag: list[str] | None, env: str, default: str = "") -> tuple[str, ...]:
    values = flag if flag is not None else (_env(env, default) or "").split(",")
    return tuple(v.strip() for item in values for v in item.split(",") if v.strip())


FLAG_TABLE_COMMANDS = ("serve", "explain")


def readme_with_flag_tables(readme: str, parser: argparse.ArgumentParser) -> str:
    """`readme` with each `<!-- flags:COMMAND -->` … `<!-- /flags -->` block regenerated."""
    for command in FLAG_TABLE_COMMANDS:
        begin, end = f"<!-- flags:{command} -->", "<!-- /flags -->"
        head, found, rest = readme.partition(begin)
        if not found:
            raise ValueError(f"README has no {begin} block")
        _, _, tail = rest.partition(end)
        table = "\n".join(flag_reference(parser, command))
        readme = f"{head}{begin}\n{table}\n{end}{tail}"
    return readme


def prometheus_access(args: argparse.Namespace) -> PrometheusAccess | None:
    """The PrometheusAccess of the --prometheus-* flags; None without --prometheus-url."""
    url = getattr(args, "prometheus_url", None)
    if not url:
        return None
    return PrometheusAccess(
        url=url,
        bearer_token_file=getattr(args, "prometheus_bearer_token_file", None) or None,
        ca_file=getattr(args, "prometheus_ca_file", None) or None,
        server_name=getattr(args, "prometheus_server_name", None) or None,
        selector=getattr(args, "prometheus_selector", "") or "",
    )


def agent_access(args: argparse.Namespace) -> AgentAccess:
    """The AgentAccess of the --agent-* flags (or their variables); `simulate` and `demo`
    have none: plain agents."""
    return AgentAccess(
        tls=bool(getattr(args, "agent_tls", False)),
        ca_file=getattr(args, "agent_ca_file", None) or None,
        server_name=getattr(args, "agent_server_name", None) or None,
        auth_file=getattr(args, "agent_auth_file", None) or None,
    )
