"""`gpuledger explain` (and `kubectl gpuledger`): read the ledgers, print the chain."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from gpuledger.cli.flags import EXIT_USAGE, agent_access, prometheus_access
from gpuledger.cli.simulate import NO_SIMULATOR, simulator_installed
from gpuledger.document.v1 import LedgerDocument
from gpuledger.explain.agents import (
    PROXY_REFUSES_AUTH,
    AgentAccess,
    AgentAccessError,
    ClusterError,
    FetchResult,
    connect,
    fetch_documents,
    read_for_query,
)
from gpuledger.explain.chain import (
    EXIT_UNREACHABLE,
    ExplainError,
    explain,
    fetch_document,
    render_text,
)
from gpuledger.explain.prometheus import PrometheusAccess, PrometheusError
from gpuledger.explain.recorded import holder_agents, read_holders
from gpuledger.explain.requests import explain_by_request, render_request_text
from gpuledger.identity.urls import safe_url

if TYPE_CHECKING:
    pass

log = logging.getLogger("gpuledger")


def _scenario_document(path: str, phase: str | None) -> LedgerDocument | None:
    """The settled ledger of a simulated scenario; None (after saying why) if it cannot run."""
    if not simulator_installed():
        print(f"gpuledger: error: --scenario: {NO_SIMULATOR}", file=sys.stderr)
        return None
    from gpuledger.sim.fake_nvml import FakeNvmlBuildError  # noqa: PLC0415 (see top)
    from gpuledger.sim.harness import settled_document  # noqa: PLC0415
    from gpuledger.sim.scenario import ScenarioError, load_scenario  # noqa: PLC0415

    try:
        return settled_document(load_scenario(path).at_phase(phase))
    except (ScenarioError, FakeNvmlBuildError) as exc:
        print(f"gpuledger: error: {exc}", file=sys.stderr)
        return None


def _discovered(args: argparse.Namespace, access: AgentAccess) -> FetchResult | int:
    """The documents of the agents the query needs, found through the Kubernetes API."""
    try:
        api = connect(
            kubeconfig=args.kubeconfig, context=args.context, deadline_seconds=args.timeout
        )
        via = args.via or ("direct" if api.in_cluster else "proxy")
        if via == "proxy" and access.auth_file:
            print(f"gpuledger: error: {PROXY_REFUSES_AUTH}", file=sys.stderr)
            return EXIT_USAGE
        return read_for_query(
            api,
            via=via,
            namespace=args.agents_namespace,
            deadline_seconds=args.timeout,
            access=access,
            pod=args.pod,
            workload=args.workload,
            engine=args.engine,
            gpu=args.gpu,
        )
    except ClusterError as exc:
        print(f"gpuledger: error: {exc} (or give --from URL)", file=sys.stderr)
        return EXIT_UNREACHABLE


def _from_prometheus(
    args: argparse.Namespace, prometheus: PrometheusAccess, access: AgentAccess
) -> FetchResult | int:
    """The documents of the agents whose series Prometheus has for the workload (and the
    cluster view's, for its pods not placed), read directly with the --agent-* flags."""
    if not args.workload:
        print("gpuledger: error: --prometheus-url answers --workload only", file=sys.stderr)
        return EXIT_USAGE
    namespace, _, name = args.workload.rpartition("/")
    try:
        client = prometheus.client(args.timeout)
    except AgentAccessError as exc:
        print(f"gpuledger: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        holders = read_holders(
            client,
            namespace,
            name,
            args.timeout,
            cluster_view=True,
            selector=prometheus.selector,
        )
    except PrometheusError as exc:
        print(f"gpuledger: error: Prometheus: {exc.message} ({exc.reason})", file=sys.stderr)
        return EXIT_UNREACHABLE
    agents = holder_agents(holders, access.scheme)
    return fetch_documents(agents, deadline_seconds=args.timeout, concurrency=32, access=access)


def run_explain(args: argparse.Namespace) -> int:
    docs: list[LedgerDocument] = []
    failures: dict[str, str] = {}  # what could not be read, by agent or URL
    access = agent_access(args)
    try:
        credentials = access.credentials()  # a file that cannot be used: a usage error
    except AgentAccessError as exc:
        print(f"gpuledger: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.scenario:
        settled = _scenario_document(args.scenario, args.phase)
        if settled is None:
            return EXIT_USAGE
        docs.append(settled)
    for url in args.sources:
        try:
            docs.append(
                fetch_document(
                    url, headers=credentials.headers, tls_context=credentials.tls_context
                )
            )
        except ExplainError as exc:
            failures[safe_url(url)] = str(exc)
    prometheus = prometheus_access(args)
    if prometheus is not None and not args.scenario and not args.sources:
        found = _from_prometheus(args, prometheus, access)
        if isinstance(found, int):
            return found
        docs.extend(found.documents.values())
        failures.update(found.failures)
    elif not args.scenario and not args.sources:
        found = _discovered(args, access)
        if isinstance(found, int):
            return found
        docs.extend(found.documents.values())
        failures.update(found.failures)
    if not docs:
        _warn_unreadable(failures)
        print("gpuledger: error: no ledger could be read", file=sys.stderr)
        return EXIT_UNREACHABLE
    try:
        if args.request:
            result = explain_by_request(docs, args.request)
        else:
            result = explain(
                docs,
                pod=args.pod,
                gpu=args.gpu,
                workload=args.workload,
                engine=args.engine,
                pool=args.pool,
            )
    except ExplainError as exc:
        _warn_unreadable(failures)  # perhaps why nothing matched
        print(f"gpuledger: {exc}", file=sys.stderr)
        return exc.code
    result["unreadable"] = failures
    result["unknowns"] = [
        *result["unknowns"],
        *(f"{key}: could not be read: {why}" for key, why in sorted(failures.items())),
    ]
    if args.output == "json":
        print(json.dumps(result, indent=1, default=str))
    elif args.request:
        sys.stdout.write(render_request_text(result))
    else:
        sys.stdout.write(render_text(result))
    return 0


def _warn_unreadable(failures: Mapping[str, str]) -> None:
    for key, why in sorted(failures.items()):
        print(f"gpuledger: warning: could not read {key}: {why}", file=sys.stderr)
