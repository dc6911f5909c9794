"""Stands up a scenario's simulated sources for the real exporter pipeline.

NVML: the fake libnvidia-ml.so.1 (compiled at run time) reading a state file.
procfs: a synthetic proc root with the files the procfs source reads.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from uuid import NAMESPACE_URL, uuid5

from gpuledger.document.v1 import LedgerDocument
from gpuledger.engines import BY_NAME, KINDS
from gpuledger.export.document import ledger_document
from gpuledger.model.spans import SpanPeer
from gpuledger.pipeline import Pipeline, PipelineConfig
from gpuledger.sim import fake_sglang, fake_vllm
from gpuledger.sim.fake_apiserver import (
    FakeApiServer,
    make_pod,
    pod_scheduled_false,
    self_signed_certificate,
)
from gpuledger.sim.fake_kubelet import FakeKubelet
from gpuledger.sim.fake_nvml import (
    FAKE_NVLINKS,
    STATE_ENV,
    FakeGpu,
    FakeMig,
    FakeNvLink,
    FakeNvmlState,
    FakePlacement,
    FakeProcess,
    build_fake_nvml,
    write_state,
)
from gpuledger.sim.fake_picker import (
    DEFAULT_MODEL,
    FakeEndpoint,
    FakePicker,
    FakePickerState,
    build,
)
from gpuledger.sim.fake_ray import (
    FakeRayDashboard,
    actor_entry,
    node_entry,
    placement_group_entry,
    ray_id,
)
from gpuledger.sim.fake_serve import (
    APPLICATIONS_PATH,
    FakeDeployment,
    FakeRayMetrics,
    FakeReplica,
    FakeRouter,
    FakeServe,
    install,
    serve_exposition,
)
from gpuledger.sim.fake_spans import SpanBatch, export_body, post
from gpuledger.sim.fake_vllm import FakeEngine, FakeVllmServer
from gpuledger.sim.ray_jobs import ray_job_rows
from gpuledger.sim.scenario import (
    Scenario,
    SimDra,
    SimEngineServer,
    SimGpu,
    SimMig,
    SimPicker,
    SimPod,
    SimPool,
    SimProcess,
    SimSliceDevice,
    mig_devices,
)
from gpuledger.sim.sockets import write_sockets

_COMM_LIMIT = 15  # the kernel cuts comm to 15 bytes; titles live in cmdline


def nvml_state(scenario: Scenario) -> FakeNvmlState:
    by_uuid = {g.uuid: g for g in scenario.gpus}
    migs = mig_devices(scenario.gpus)
    used = {g.uuid: g.memory_reserved for g in scenario.gpus}
    on_mig: dict[str, int] = dict.fromkeys(migs, 0)
    processes = []
    for proc in scenario.processes:
        for uuid, size in proc.gpu_memory.items():
            if uuid in migs:
                gpu, mig = migs[uuid]
                on_mig[uuid] += size
                processes.append(FakeProcess(gpu.index, proc.pid, size, mig.index))
            else:
                used[uuid] += size
                processes.append(FakeProcess(by_uuid[uuid].index, proc.pid, size))
    fake_migs = tuple(_fake_mig(gpu, mig, on_mig[uuid]) for uuid, (gpu, mig) in migs.items())
    for fake, (gpu, _mig) in zip(fake_migs, migs.values(), strict=True):
        used[gpu.uuid] += fake.memory_used  # the GPU's memory holds its instances'
    gpus = tuple(
        FakeGpu(
            index=g.index,
            uuid=g.uuid,
            name=g.name,
            pci_bus_id=g.pci_bus_id,
            memory_total=g.memory_total,
            memory_used=min(used[g.uuid], g.memory_total),
            util_gpu=round(g.utilization * 100),
            util_memory=0,
            mig_mode=g.mig_mode,
            lost=g.lost,
        )
        for g in sorted(scenario.gpus, key=lambda g: g.index)
    )
    return FakeNvmlState(
        gpus=gpus,
        processes=tuple(processes),
        migs=fake_migs,
        driver_version=scenario.nvml.driver_version,
        init_error=scenario.nvml.init_error,
        placements=tuple(
            FakePlacement(g.index, g.numa_node, g.host_bridge, g.pcie_switches)
            for g in scenario.gpus
            if g.numa_node is not None
        ),
        nvlinks=fake_nvlinks(scenario.gpus),
        nvlink_errors=tuple((g.index, g.nvlink_error) for g in scenario.gpus if g.nvlink_error),
    )


# Where the fake's NVSwitches sit on the PCI bus (an HGX baseboard has four).
_NVSWITCHES = tuple(f"00000000:{0xC0 + i:02X}:00.0" for i in range(4))


def fake_nvlinks(gpus: Sequence[SimGpu]) -> tuple[FakeNvLink, ...]:
    """Each GPU's active NVLinks, numbered from 0: one to each NVSwitch (nvswitch), then
    one to each peer (nvlink_peers, on both ends); at most FAKE_NVLINKS per GPU."""
    by_index = {g.index: g for g in gpus}
    peers: dict[int, set[int]] = {g.index: set() for g in gpus}
    for g in gpus:
        for p in g.nvlink_peers:
            if p in by_index and p != g.index:
                peers[g.index].add(p)
                peers[p].add(g.index)
    links: list[FakeNvLink] = []
    for g in sorted(gpus, key=lambda g: g.index):
        far = [(bus, "switch") for bus in (_NVSWITCHES if g.nvswitch else ())]
        far += [(by_index[p].pci_bus_id, "gpu") for p in sorted(peers[g.index])]
        links.extend(
            FakeNvLink(g.index, n, bus, kind) for n, (bus, kind) in enumerate(far[:FAKE_NVLINKS])
        )
    return tuple(links)


def _fake_mig(gpu: SimGpu, mig: SimMig, processes_bytes: int) -> FakeMig:
    gpu_slices, compute_slices = mig.slices
    used = processes_bytes if mig.memory_used is None else mig.memory_used
    return FakeMig(
        gpu_index=gpu.index,
        index=mig.index,
        uuid=mig.uuid,
        profile=mig.profile,
        gpu_instance_id=mig.gpu_instance_id,
        compute_instance_id=mig.compute_instance_id,
        gpu_slices=gpu_slices,
        compute_slices=compute_slices,
        memory_total=mig.memory_total,
        memory_used=min(used, mig.memory_total),
    )


def _status(proc: SimProcess) -> str:
    comm = Path(proc.cmdline[0]).name[:_COMM_LIMIT]
    nspid = "\t".join(str(p) for p in (proc.nspid or (proc.pid,)))
    return (
        f"Name:\t{comm}\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t{proc.pid}\n"
        f"Ngid:\t0\nPid:\t{proc.pid}\nPPid:\t{proc.ppid}\nTracerPid:\t0\n"
        f"NStgid:\t{nspid}\nNSpid:\t{nspid}\n"
    )


def _stat(proc: SimProcess) -> str:
    """`stat` as the kernel writes it, up to field 22 (the start time: one per PID here,
    as a process keeps its own)."""
    comm = Path(proc.cmdline[0]).name[:_COMM_LIMIT]
    middle = " ".join(["0"] * 17)  # fields 5-21
    return f"{proc.pid} ({comm}) S {proc.ppid} {middle} {1000 + proc.pid}\n"


def write_proc_root(root: Path, processes: tuple[SimProcess, ...]) -> None:
    """Rewrite the synthetic proc root to hold exactly `processes`."""
    root.mkdir(parents=True, exist_ok=True)
    wanted = {str(p.pid) for p in processes}
    for entry in root.iterdir():
        if entry.name.isdigit() and entry.name not in wanted:
            shutil.rmtree(entry, ignore_errors=True)
    for proc in processes:
        base = root / str(proc.pid)
        base.mkdir(exist_ok=True)
        files = {
            "status": _status(proc).encode(),
            "stat": _stat(proc).encode(),
            "cmdline": b"".join(a.encode() + b"\0" for a in proc.cmdline),
            "comm": (Path(proc.cmdline[0]).name[:_COMM_LIMIT] + "\n").encode(),
            "cgroup": (proc.cgroup.rstrip("\n") + "\n").encode(),
            "environ": b"".join(f"{k}={v}".encode() + b"\0" for k, v in proc.environ.items()),
        }
        for name, content in files.items():
            _replace_file(base / name, content)


def _replace_file(path: Path, content: bytes) -> None:
    """Rewrite only what changed, atomically: a procfs read racing a phase change must see
    the old or the new file, never a truncated one (as with the real /proc)."""
    try:
        if path.read_bytes() == content:
            return
    except OSError:
        pass
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_bytes(content)
    os.replace(temporary, path)


def pod_object(
    pod: SimPod, ip: str | None, engine_port: int | str | None, kind: str = KINDS[0].name
) -> dict[str, Any]:
    """The Pod as the API server would return it (`engine_port` may list several), its
    engines of one `kind`."""
    annotations = dict(pod.annotations)
    if engine_port is not None:
        # Point whichever discovery annotation the pod uses at the simulated engine.
        key = "prometheus.io/port" if "prometheus.io/port" in annotations else None
        annotations[key or BY_NAME[kind].port_annotation] = str(engine_port)
    conditions = None
    if pod.pending_reason:
        conditions = [pod_scheduled_false(pod.pending_reason, pod.pending_message)]
    elif not pod.ready and pod.node:
        conditions = [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": None},
            {
                "type": "Ready",
                "status": "False",
                "reason": "ContainersNotReady",
                "lastTransitionTime": None,
            },
        ]
    obj = make_pod(
        pod.namespace,
        pod.name,
        uid=pod.uid,
        node=pod.node or None,
        phase=pod.phase,
        labels=pod.labels,
        owner=pod.owner,
        containers=[
            (c.name, c.gpus, f"containerd://{c.id}" if c.id else None) for c in pod.containers
        ],
        conditions=conditions,
        container_resources={c.name: c.gpu_resource for c in pod.containers},
        pod_ip=ip,
        scheduling_gates=("kueue.x-k8s.io/admission",)
        if pod.pending_reason == "SchedulingGated"
        else (),
        annotations=annotations,
    )
    if pod.claims:
        # Claims named directly (resourceClaimName); the first container uses them all.
        obj["spec"]["resourceClaims"] = [{"name": c, "resourceClaimName": c} for c in pod.claims]
        resources = obj["spec"]["containers"][0]["resources"]
        resources["claims"] = [{"name": c} for c in pod.claims]
    return obj


def slice_objects(dra: SimDra) -> list[dict[str, Any]]:
    """ResourceSlices (resource.k8s.io/v1) as the NVIDIA DRA driver publishes them."""
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{s.node}-{s.driver}-{i}"},
            "spec": {
                "driver": s.driver,
                "nodeName": s.node,
                "pool": {"name": s.pool, "generation": 1, "resourceSliceCount": 1},
                "devices": [_slice_device(d) for d in s.devices],
            },
        }
        for i, s in enumerate(dra.slices)
    ]


def _slice_device(d: SimSliceDevice) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "type": {"string": "mig" if d.parent_uuid else "gpu"},
        "uuid": {"string": d.uuid},
    }
    if d.parent_uuid:
        attributes["parentUUID"] = {"string": d.parent_uuid}
    if d.profile:
        attributes["profile"] = {"string": d.profile}
    return {"name": d.name, "attributes": attributes}


def claim_objects(dra: SimDra) -> list[dict[str, Any]]:
    """ResourceClaims (resource.k8s.io/v1): one request of `count` devices of a class."""
    out = []
    for c in dra.claims:
        status: dict[str, Any] = {}
        if c.allocated:
            status["allocation"] = {"devices": {"results": []}}
        if c.reserved_for:
            status["reservedFor"] = [{"resource": "pods", "name": p} for p in c.reserved_for]
        metadata: dict[str, Any] = {"namespace": c.namespace, "name": c.name}
        if c.deleting:
            metadata["deletionTimestamp"] = "2025-01-01T00:00:00Z"
        out.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": metadata,
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "gpu",
                                "exactly": {
                                    "deviceClassName": c.device_class,
                                    "allocationMode": "ExactCount",
                                    "count": c.count,
                                },
                            }
                        ]
                    }
                },
                "status": status,
            }
        )
    return out


# Kubernetes objects of the gateway (tests/fixtures/gateway/): fixed times, so that an
# unchanged pool is the same object in every phase.
_GATEWAY_CREATED = "2026-08-20T09:14:02Z"
_GATEWAY_ACCEPTED = "2026-08-20T09:14:05Z"
EXT_PROC_PORT = 9002  # the picker's ext-proc gRPC port (--grpc-port), which the gateway calls


def _gateway_uid(kind: str, namespace: str, name: str) -> str:
    return str(uuid5(NAMESPACE_URL, f"gpuledger-sim/{kind}/{namespace}/{name}"))


def _helm_metadata(pool: SimPool, picker: SimPicker) -> dict[str, Any]:
    """What the picker's chart (release = the pool's name) puts on the pool and Service."""
    return {
        "labels": {
            "app.kubernetes.io/managed-by": "Helm",
            "app.kubernetes.io/name": picker.service,
            "app.kubernetes.io/version": picker_build(picker)[0],
        },
        "annotations": {
            "meta.helm.sh/release-name": pool.name,
            "meta.helm.sh/release-namespace": pool.namespace,
        },
    }


def picker_build(picker: SimPicker) -> tuple[str, str]:
    """(version, commit) of the picker: GIE v1.5.0 for the legacy names, else llm-d-router."""
    return build("legacy" if picker.names == "legacy" else "both")


def pool_object(pool: SimPool) -> dict[str, Any]:
    """An InferencePool (inference.networking.k8s.io/v1) as the API server returns it: CRD
    defaults applied, accepted by a Gateway `inference-gateway` of its namespace."""
    metadata: dict[str, Any] = {
        "name": pool.name,
        "namespace": pool.namespace,
        "uid": _gateway_uid("inferencepool", pool.namespace, pool.name),
        "generation": 1,
        "creationTimestamp": _GATEWAY_CREATED,
    }
    spec: dict[str, Any] = {
        "selector": {"matchLabels": dict(pool.selector)},
        "targetPorts": [{"number": n} for n in pool.target_ports],
        "appProtocol": "http",
    }
    if pool.picker is not None:
        metadata |= _helm_metadata(pool, pool.picker)
        spec["endpointPickerRef"] = {
            "group": "",
            "kind": "Service",
            "name": pool.picker.service,
            "port": {"number": EXT_PROC_PORT},
            "failureMode": pool.failure_mode,
        }
    conditions = [
        ("Accepted", "Accepted", "Referenced by an HTTPRoute accepted by the parentRef Gateway"),
        ("ResolvedRefs", "ResolvedRefs", "Resolved ExtensionRef"),
    ]
    parent = {
        "parentRef": {
            "group": "gateway.networking.k8s.io",
            "kind": "Gateway",
            "name": "inference-gateway",
            "namespace": pool.namespace,
        },
        "controllerName": "istio.io/gateway-controller",
        "conditions": [
            {
                "type": kind,
                "status": "True",
                "observedGeneration": 1,
                "lastTransitionTime": _GATEWAY_ACCEPTED,
                "reason": reason,
                "message": message,
            }
            for kind, reason, message in conditions
        ],
    }
    return {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": metadata,
        "spec": spec,
        "status": {"parents": [parent]},
    }


def picker_service(pool: SimPool, picker: SimPicker, host: str, port: int) -> dict[str, Any]:
    """The picker's Service as its chart makes it and the API server stores it, its
    clusterIP the fake picker's address and its `http-metrics` port the fake's port."""
    router = picker.names != "legacy"
    ext_proc: dict[str, Any] = {
        "name": "grpc-ext-proc",
        "protocol": "TCP",
        "port": EXT_PROC_PORT,
        "targetPort": EXT_PROC_PORT,
    }
    if router:  # GIE v1.5.0's chart names no appProtocol
        ext_proc["appProtocol"] = "kubernetes.io/h2c"
    metrics = {"name": "http-metrics", "protocol": "TCP", "port": port, "targetPort": port}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": picker.service,
            "namespace": pool.namespace,
            "uid": _gateway_uid("service", pool.namespace, picker.service),
            "resourceVersion": "1",
            "creationTimestamp": _GATEWAY_CREATED,
            **_helm_metadata(pool, picker),
        },
        "spec": {
            "selector": {("llm-d-router-gateway" if router else "inferencepool"): picker.service},
            "ports": [ext_proc, metrics],
            "type": "ClusterIP",
            "clusterIP": host,
            "clusterIPs": [host],
            "ipFamilies": ["IPv4"],
            "ipFamilyPolicy": "SingleStack",
            "sessionAffinity": "None",
            "internalTrafficPolicy": "Cluster",
        },
        "status": {"loadBalancer": {}},
    }


def picker_state(pool: SimPool, picker: SimPicker, state: Scenario) -> FakePickerState:
    """What the pool's picker reports in `state`: an endpoint per ready member pod and
    target port, rank i's values from the pod's i-th `engines` entry (its engines' waiting
    and running summed, KV cache usage averaged), idle where it has none."""
    endpoints = []
    model = None
    for pod in sorted(state.pods or (), key=lambda p: p.name):
        if not (pool.selects(pod) and pod.ready and pod.node):
            continue
        servers = [e for e in state.engines if e.pod == pod.key]
        for rank, port in enumerate(pool.target_ports):
            engines = servers[rank].engines if rank < len(servers) else ()
            model = model or next((e.model_name for e in engines), None)
            kv = sum(e.kv_cache_usage for e in engines) / len(engines) if engines else 0.0
            endpoints.append(
                FakeEndpoint(
                    pod=pod.name,
                    namespace=pod.namespace,
                    rank=rank,
                    port=port,
                    queue=sum(e.waiting for e in engines),
                    running=sum(e.running for e in engines),
                    kv_cache_usage=kv,
                )
            )
    ready = picker.ready_endpoints
    return FakePickerState(
        pool=pool.name,
        names=picker.names,  # type: ignore[arg-type]
        flow_control=picker.flow_control,
        queued=picker.queued,
        queued_bytes=picker.queued_bytes,
        saturation=picker.saturation,
        ready_endpoints=len(endpoints) if ready is None else ready,
        endpoints=tuple(endpoints),
        model_name=model or DEFAULT_MODEL,
    )


def picker_token(scenario: Scenario) -> str | None:
    """The token the exporter sends pickers (one for all): the first picker's that has one."""
    pools = scenario.gateway.pools if scenario.gateway is not None else ()
    return next((p.picker.token for p in pools if p.picker and p.picker.token), None)


def _ray_workload(scenario: Scenario) -> tuple[str, str]:
    text = scenario.ray.workload if scenario.ray is not None else None
    if not text:
        return "", "ray"
    namespace, _, name = str(text).rpartition("/")
    return namespace, name


# Each engine kind's fake exposition; the HTTP side and its faults are shared.
RENDERERS: Mapping[str, Callable[[Sequence[FakeEngine]], str]] = {
    fake.KIND: fake.render_exposition for fake in (fake_vllm, fake_sglang)
}


def fake_engines(sim: SimEngineServer) -> list[FakeEngine]:
    return [
        FakeEngine(
            model_name=e.model_name,
            engine=e.engine,
            running=e.running,
            waiting=e.waiting,
            waiting_by_reason=dict(e.waiting_by_reason),
            kv_cache_usage=e.kv_cache_usage,
            preemptions_total=e.preemptions_total,
            num_gpu_blocks=e.num_gpu_blocks,
            block_size=e.block_size,
            style=sim.style,
        )
        for e in sim.engines
    ]


class SimulatedNode:
    """A scenario's simulated sources, living in a work directory until closed."""

    def __init__(
        self, scenario: Scenario, workdir: Path | None = None, *, in_cluster: bool = False
    ) -> None:
        """`in_cluster`: the API server speaks HTTPS and wants a bearer token, and
        `service_account_dir`/`service_env` hold what a pod gets (needs `cryptography`)."""
        self.scenario = scenario
        self.in_cluster = in_cluster
        self.service_account_dir: Path | None = None
        self.service_env: dict[str, str] = {}
        self._own_dir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="gpuledger-sim-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc_root = self.workdir / "proc"
        self.state_file = self.workdir / "nvml.state"
        if scenario.nvml.library == "missing":
            self.library_path = str(self.workdir / "absent" / "libnvidia-ml.so.1")
        else:
            self.library_path = str(build_fake_nvml(frozenset(scenario.nvml.variants)))
        # The fake library reads this at every (re)load; one simulated node per process.
        os.environ[STATE_ENV] = str(self.state_file)
        self.apiserver: FakeApiServer | None = None
        self.kubelet: FakeKubelet | None = None
        self.engines: dict[str, FakeVllmServer] = {}
        self._socket_dir: str | None = None
        self.ray: FakeRayDashboard | None = None
        # Ray Serve: the dashboard's Serve answers, and each Ray node's metrics endpoint.
        self.serve: FakeServe | None = None
        self.ray_metrics: dict[str, FakeRayMetrics] = {}
        # The pools' endpoint pickers, by pool namespace/name.
        self.pickers: dict[str, FakePicker] = {}
        self._pods: dict[str, SimPod] = {}
        try:
            self._start_services(scenario)
            self.apply(scenario)
        except BaseException:
            self.close()
            raise

    def _start_services(self, scenario: Scenario) -> None:
        # Each pod's engines, and each static engine, get their own loopback address,
        # like a pod IP (any 127/8 works); engines of one pod differ by port.
        hosts: dict[str, str] = {}
        for i, sim in enumerate(scenario.engines):
            host = hosts.setdefault(sim.pod or sim.key, f"127.77.{i // 250}.{i % 250 + 1}")
            server = FakeVllmServer(
                fake_engines(sim),
                fault=sim.fault,  # type: ignore[arg-type]
                host=host,
                render=RENDERERS[sim.kind],
            )
            self.engines[sim.key] = server.start()
        if scenario.pods is not None and self.in_cluster:
            tls = self_signed_certificate(self.workdir / "tls")
            self.apiserver = FakeApiServer(tls=tls, token=secrets.token_urlsafe(24)).start()
            self.service_account_dir = self.workdir / "serviceaccount"
            self.service_env = self.apiserver.service_account(self.service_account_dir)
        elif scenario.pods is not None:
            self.apiserver = FakeApiServer().start()
            self.kubeconfig = self.apiserver.kubeconfig(self.workdir / "kubeconfig")
        if scenario.gateway is not None and self.apiserver is not None:
            self._start_pickers(scenario)
        if scenario.ray is not None:
            self.ray = FakeRayDashboard(token=scenario.ray.token).start()
            if scenario.ray.serve is not None or any(p.ray_serve for p in scenario.phases):
                self._start_serve(scenario)
        if scenario.allocations is not None:
            # Unix socket paths are limited to 107 bytes: keep this one short.
            self._socket_dir = tempfile.mkdtemp(prefix="gl-", dir="/tmp")
            self.socket_path = os.path.join(self._socket_dir, "kubelet.sock")
            self.kubelet = FakeKubelet(self.socket_path).start()

    def _start_pickers(self, scenario: Scenario) -> None:
        """Each pool's picker on its own loopback address (`127.79.x.y`), its Service's
        clusterIP, on a port of its own, the Service's `http-metrics` port."""
        assert scenario.gateway is not None
        pools = [p for p in scenario.gateway.pools if p.picker is not None]
        for i, pool in enumerate(pools):
            assert pool.picker is not None
            picker = FakePicker(
                picker_state(pool, pool.picker, scenario),
                host=f"127.79.{i // 250}.{i % 250 + 1}",
                token=pool.picker.token,
                fault=pool.picker.fault,  # type: ignore[arg-type]
            )
            self.pickers[pool.key] = picker.start()

    def _sync_gateway(self, state: Scenario) -> None:
        assert self.apiserver is not None and state.gateway is not None
        gateway = state.gateway
        pools = None if gateway.fault == "not_served" else [pool_object(p) for p in gateway.pools]
        self.apiserver.set_inference_pools(pools)
        services = []
        for pool in gateway.pools:
            picker = self.pickers.get(pool.key)
            if pool.picker is None or picker is None:
                continue
            services.append(picker_service(pool, pool.picker, picker.host, picker.port))
            picker.set_state(picker_state(pool, pool.picker, state))
            picker.set_fault(pool.picker.fault)
        self.apiserver.set_services(services)

    def _ray_seed(self) -> str:
        """What Ray ids derive from: `ray.cluster`, shared by the scenarios of the node
        agents of one Ray cluster, else this node's name."""
        ray = self.scenario.ray
        return (ray.cluster if ray is not None else None) or self.scenario.node

    def _ray_node_id(self, name: str) -> str:
        return ray_id("node", f"{self._ray_seed()}/{name}")

    def _start_serve(self, scenario: Scenario) -> None:
        """Each Ray node gets its own loopback address for its metrics export port, which
        is also its node IP (and its pod's IP, as with KubeRay)."""
        assert self.ray is not None and scenario.ray is not None
        serve = self.serve = FakeServe()
        install(self.ray, serve)
        for i, n in enumerate(scenario.ray.nodes):
            host = f"127.78.{i // 250}.{i % 250 + 1}"
            node_id = self._ray_node_id(n.name)

            def render(node_id: str = node_id, host: str = host) -> str:
                return serve_exposition(node_id, host, serve.snapshot()[0])

            self.ray_metrics[n.name] = FakeRayMetrics(render, host).start()

    def apply(self, state: Scenario) -> None:
        """Make the simulated node look like `state` (a scenario, possibly at a phase)."""
        write_state(self.state_file, nvml_state(state))
        write_proc_root(self.proc_root, state.processes)
        write_sockets(self.proc_root, state, self.engines)
        for sim in state.engines:
            server = self.engines[sim.key]
            server.set_engines(fake_engines(sim))
            server.set_fault(sim.fault)  # type: ignore[arg-type]
            info = sim.server_info
            server.set_documents(
                fake_sglang.server_info_documents(info), info.fault if info else "ok"
            )
        if self.apiserver is not None:
            self.apiserver.set_fault(state.kubernetes_fault)  # type: ignore[arg-type]
            self._sync_pods(state)
            if state.dra is not None and state.dra.fault != "not_served":
                self.apiserver.set_dra_objects("resourceslices", slice_objects(state.dra))
                self.apiserver.set_dra_objects("resourceclaims", claim_objects(state.dra))
            if state.gateway is not None:
                self._sync_gateway(state)
        if self.kubelet is not None:
            self._sync_allocations(state)
        if self.ray is not None:
            self._sync_ray(state)

    def _sync_ray(self, state: Scenario) -> None:
        assert self.ray is not None and state.ray is not None
        sim = state.ray
        pods = {p.key: p for p in state.pods or ()}
        ids = {n.name: self._ray_node_id(n.name) for n in sim.nodes}
        ips: dict[str, str] = {}
        nodes = []
        for i, n in enumerate(sim.nodes):
            pod = pods.get(n.pod) if n.pod else None
            ip = (pod.pod_ip if pod else None) or n.ip or f"10.244.{i // 250}.{i % 250 + 2}"
            if n.name in self.ray_metrics:
                ip = self.ray_metrics[n.name].host
            ips[n.name] = ip
            nodes.append(
                node_entry(
                    ip,
                    gpus=n.gpus,
                    is_head=n.head,
                    node_id=ids[n.name],
                    node_name=pod.name if pod else n.name,
                )
            )
        groups = {
            g.name: placement_group_entry(
                g.name,
                [{"GPU": b} for b in g.bundles],
                state=g.state,
                scheduling_state=g.scheduling_state,
            )
            for g in sim.placement_groups
        }
        actors = [
            actor_entry(
                a.class_name,
                state=a.state,
                node_id=ids.get(a.node) if a.node else None,
                pid=a.pid,
                num_gpus=a.num_gpus,
                name=f"{a.class_name}-{i}",
                placement_group_id=groups[a.placement_group]["placement_group_id"]
                if a.placement_group in groups
                else None,
            )
            for i, a in enumerate(sim.actors)
        ]
        jobs, job_groups, workers = ray_job_rows(sim, ids, ips, self._ray_seed())
        self.ray.set_nodes(nodes)
        self.ray.set_actors(actors + workers)
        self.ray.set_placement_groups(list(groups.values()) + job_groups)
        self.ray.set_jobs(jobs)
        self.ray.set_fault(sim.fault)  # type: ignore[arg-type]
        if self.serve is not None:
            self._sync_serve(state)

    def _sync_serve(self, state: Scenario) -> None:
        assert self.ray is not None and self.serve is not None and state.ray is not None
        sim = state.ray.serve
        hosts = {name: m.host for name, m in self.ray_metrics.items()}
        ids = {name: self._ray_node_id(name) for name in hosts}
        self.serve.set_deployments(
            [
                FakeDeployment(
                    d.application,
                    d.name,
                    d.max_ongoing_requests,
                    d.status,
                    tuple(
                        FakeReplica(r.id, ids[r.node], hosts[r.node], r.pid, r.state, r.ongoing)
                        for r in d.replicas
                    ),
                    tuple(FakeRouter(ids[r.node], r.queued, r.at_replicas) for r in d.routers),
                )
                for d in (sim.deployments if sim is not None else ())
            ]
        )
        for name, metrics in self.ray_metrics.items():
            self.serve.set_metrics_port(ids[name], metrics.port)
            metrics.set_fault(sim.metrics_fault if sim is not None else "ok")
        fault = sim.fault if sim is not None else "ok"
        self.ray.set_fault(fault, path=APPLICATIONS_PATH)  # type: ignore[arg-type]

    def _sync_pods(self, state: Scenario) -> None:
        assert self.apiserver is not None
        wanted = {p.key: p for p in state.pods or ()}
        for key, old in list(self._pods.items()):
            if key not in wanted:
                self.apiserver.delete_pod(old.namespace, old.name)
                del self._pods[key]
        for key, pod in wanted.items():
            if self._pods.get(key) == pod:
                continue
            mine = [v for v in state.engines if v.pod == key]
            servers = [self.engines[v.key] for v in mine]
            ip = servers[0].host if servers else self._ray_pod_ip(key) or pod.pod_ip
            ports = ",".join(str(s.port) for s in servers) or None
            obj = pod_object(pod, ip, ports, *(v.kind for v in mine[:1]))
            if key in self._pods:
                self.apiserver.update_pod(obj)
            else:
                self.apiserver.add_pod(obj)
            self._pods[key] = pod

    def _ray_pod_ip(self, key: str) -> str | None:
        """A Ray pod whose node has a simulated metrics endpoint has its address."""
        nodes = self.scenario.ray.nodes if self.scenario.ray is not None else ()
        hosts = [
            self.ray_metrics[n.name].host
            for n in nodes
            if n.pod == key and n.name in self.ray_metrics
        ]
        return hosts[0] if hosts else None

    def _sync_allocations(self, state: Scenario) -> None:
        assert self.kubelet is not None
        fault = state.podresources_fault
        self.kubelet.set_fault("ok" if fault == "missing" else fault)  # type: ignore[arg-type]
        grouped: dict[tuple[str, str], dict[str, list[tuple[str, list[str]]]]] = {}
        for a in state.allocations or ():
            containers = grouped.setdefault((a.namespace, a.pod), {})
            containers.setdefault(a.container, []).append((a.resource, list(a.devices)))
        self.kubelet.set_pods([(ns, pod, list(cs.items())) for (ns, pod), cs in grouped.items()])
        self.kubelet.set_dynamic(
            [
                (
                    x.namespace,
                    x.pod,
                    x.container,
                    x.claim_namespace,
                    x.claim,
                    x.driver,
                    x.pool,
                    x.device,
                    x.share_id,
                )
                for x in state.dynamic
            ]
        )

    def pipeline_config(self, deadline_seconds: float = 5.0) -> PipelineConfig:
        socket = None
        if self.kubelet is not None:
            missing = self.scenario.podresources_fault == "missing"
            socket = self.socket_path + ".absent" if missing else self.socket_path
        return PipelineConfig(
            node=self.scenario.node,
            mode=self.scenario.mode,
            proc_root=str(self.proc_root),
            nvml_library=self.library_path,
            source_deadline_seconds=deadline_seconds,
            podresources_socket=socket,
            kubernetes=self.apiserver is not None,
            dra=self.scenario.dra is not None,
            gateway=self.scenario.gateway is not None and self.apiserver is not None,
            gateway_picker_token=picker_token(self.scenario),
            # In cluster: none, the exporter reads the service account (see service_env).
            kubeconfig=None if self.apiserver is None or self.in_cluster else str(self.kubeconfig),
            engine_targets=tuple(
                self.engines[v.key].url for v in self.scenario.engines if v.pod is None
            ),
            ray_address=self.ray.url if self.ray is not None else None,
            ray_token=self.scenario.ray.token if self.scenario.ray is not None else None,
            ray_workload=_ray_workload(self.scenario),
            simulated=True,
            otlp_receiver=sends_spans(self.scenario),
        )

    def span_batches(self, state: Scenario, phase_start_ns: int) -> list[SpanBatch]:
        """What each engine server of `state` with requests sends, from its address."""
        batches = []
        for sim in state.engines:
            if not sim.requests:
                continue
            body = export_body(
                sim.requests,
                phase_start_ns,
                kind=BY_NAME[sim.kind],
                process_id=_sender_pid(sim, state),
            )
            batches.append(SpanBatch(self.engines[sim.key].host, body))
        return batches

    def close(self) -> None:
        for picker in self.pickers.values():
            picker.stop()
        for metrics in self.ray_metrics.values():
            metrics.stop()
        if self.ray is not None:
            self.ray.stop()
        for server in self.engines.values():
            server.stop()
        if self.apiserver is not None:
            self.apiserver.close()
        if self.kubelet is not None:
            self.kubelet.stop(grace_seconds=0.2)
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> SimulatedNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PhaseClock:
    """Advances a simulated node through its scenario's phases in real time, and once
    the agent serves, has each phase's engines send their requests' spans to it when the
    last of them has finished."""

    def __init__(self, node: SimulatedNode, scenario: Scenario) -> None:
        self.node, self.scenario = node, scenario
        self.started = time.monotonic()
        self.current: str | None = None
        self._phase_wall = time.time()
        self._phase_started = self.started
        self._endpoint: str | None = None
        self._sent = False

    def serving(self, url: str) -> None:
        """The agent's base URL: spans go to its POST /v1/traces."""
        self._endpoint = url + "/v1/traces"

    def tick(self) -> None:
        elapsed = time.monotonic() - self.started
        due = [p.name for p in self.scenario.phases if p.after_seconds <= elapsed]
        if due and due[-1] != self.current:
            self.current = due[-1]
            logging.getLogger(__name__).info("scenario phase %s", self.current)
            self.node.apply(self.scenario.at_phase(self.current))
            self._phase_wall, self._phase_started, self._sent = time.time(), time.monotonic(), False
        self._send_spans()

    def _send_spans(self) -> None:
        state = self.scenario.at_phase(self.current)
        if self._endpoint is None or self._sent:
            return
        if time.monotonic() - self._phase_started < _last_finish(state):
            return
        self._sent = True
        for batch in self.node.span_batches(state, int(self._phase_wall * 1e9)):
            try:
                post(self._endpoint, batch)
            except OSError as exc:
                logging.getLogger(__name__).warning("simulated spans not sent: %s", exc)


def _last_finish(state: Scenario) -> float:
    """Seconds into the phase when its last simulated request has finished."""
    ends = [r.after + r.queue + r.prefill + r.decode for sim in state.engines for r in sim.requests]
    return max(ends, default=0.0) + 0.5


def sends_spans(scenario: Scenario) -> bool:
    """Whether any phase's engines send spans: then the agent's receiver is on."""
    names = [None, *(p.name for p in scenario.phases)]
    return any(sim.requests for name in names for sim in scenario.at_phase(name).engines)


def _sender_pid(sim: SimEngineServer, state: Scenario) -> int | None:
    """vllm.process_id: the engine's API server's PID in its own namespace (the last
    NSpid entry), as vLLM reports os.getpid()."""
    procs = {p.pid: p for p in state.processes}
    prefix = BY_NAME[sim.kind].title_prefix
    pid = sim.api_server
    if pid is None:
        servers = {
            p.ppid
            for p in state.processes
            if p.cmdline[:1]
            and p.cmdline[0].startswith(prefix)
            and p.ppid in procs
            and not procs[p.ppid].cmdline[0].startswith(prefix)
        }
        pod = next((p for p in state.pods or () if f"{p.namespace}/{p.name}" == sim.pod), None)
        mark = pod.uid.replace("-", "_") if pod is not None else None
        mine = [s for s in servers if mark is None or mark in procs[s].cgroup]
        pid = mine[0] if len(mine) == 1 else None
    if pid is None or pid not in procs:
        return None
    return (procs[pid].nspid or (pid,))[-1]


def deliver_spans(node: SimulatedNode, state: Scenario, pipeline: Pipeline) -> None:
    """Without an HTTP server: the engines' spans handed to the receiver, each from its
    engine's address, after one cycle so that the engine's state before them is sampled."""
    sink = pipeline.span_sink
    if sink is None:
        return
    pipeline.cycle()
    start_ns = int((time.time() - _last_finish(state)) * 1e9)
    for batch in node.span_batches(state, start_ns):
        sink.accept(batch.body, "application/x-protobuf", "", SpanPeer(batch.source_host))


def settled_document(scenario: Scenario, deadline_seconds: float = 5.0) -> LedgerDocument:
    """Run `scenario` (at its current phase) and return the ledger document once every
    simulated source has answered, or after `deadline_seconds` of trying."""
    with SimulatedNode(scenario) as node:
        pipeline = Pipeline(node.pipeline_config(deadline_seconds))
        try:
            pipeline.warm_up(deadline_seconds)
            give_up = time.monotonic() + deadline_seconds
            deliver_spans(node, scenario, pipeline)
            while True:
                published = pipeline.cycle()
                down = [s for s in published.ledger.sources if s.state == "down"]
                if not down or time.monotonic() > give_up:
                    return ledger_document(published)
                time.sleep(0.1)
        finally:
            pipeline.close()
