"""Real-GPU check: a real CUDA process must come out of the real sources as it is.

1. A whole GPU: a child under the title `gpuledger-check-worker` allocates 1 GiB on cuda:0
   with CUDA_VISIBLE_DEVICES naming the *last* GPU not in MIG mode (so cuda:0 is not host
   index 0 on multi-GPU machines); checked: PID, title, GPU UUID, memory, cuda:0 -> UUID,
   and that no secret of its environment reaches the ledger.
2. A MIG device, where the machine has one: the same with CUDA_VISIBLE_DEVICES naming it
   (256 MiB); checked: the MIG device under its GPU with the instance ids and profile NVML
   gives, the process on the MIG device (not on its GPU), cuda:0 -> the MIG UUID, and the
   series keyed by the MIG UUID with `parent_gpu_uuid`. Read-only: nothing here changes a
   GPU's MIG mode or its instances, and the check verifies every GPU's MIG mode is the same
   after as before. Without a MIG device it says so, and that is no failure.
3. The topology, read-only: per GPU its NVLinks (state, far end's PCI bus id and type),
   per pair NVML's common ancestor, printed as NVML answers them; checked: the NVML
   source reads every pair, with the same common ancestor, and NVLink where a link of one
   ends at the other. With one GPU there is no pair: it prints the GPU's links and says so.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pynvml

from gpuledger.export.collector import snapshot_families
from gpuledger.export.exposition import render_text
from gpuledger.export.published import Published
from gpuledger.ledger import Ledger, build_ledger
from gpuledger.model import Snapshots
from gpuledger.model.nvml import NVML, NvmlSnapshot
from gpuledger.model.procfs import PROCESSES
from gpuledger.sources.nvml import NvmlSource
from gpuledger.sources.nvml_topology import MAX_TOPOLOGY_GPUS
from gpuledger.sources.procfs.source import ProcfsSource

TITLE = "gpuledger-check-worker"
SECRET = "hf_gpucheck_secret"  # noqa: S105 (a canary the ledger must not carry)
MiB = 1024**2
CHILD = """
import sys, time, torch
x = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device="cuda:0")
torch.cuda.synchronize()
print(str(torch.cuda.get_device_properties(0).uuid), flush=True)
time.sleep(120)
"""


def text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class Inventory:
    """What NVML says before anything runs: every GPU's MIG mode, the GPUs not in MIG
    mode, and the MIG devices as (parent UUID, MIG UUID, GI, CI)."""

    modes: dict[str, tuple[int, int] | None]
    whole: list[str]
    migs: list[tuple[str, str, int, int]]


def inventory() -> Inventory:
    modes: dict[str, tuple[int, int] | None] = {}
    whole: list[str] = []
    migs: list[tuple[str, str, int, int]] = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(i)
        uuid = text(pynvml.nvmlDeviceGetUUID(handle))
        try:
            current, pending = pynvml.nvmlDeviceGetMigMode(handle)
        except pynvml.NVMLError_NotSupported:
            modes[uuid] = None  # no MIG on this GPU model
            whole.append(uuid)
            continue
        modes[uuid] = (int(current), int(pending))
        if current != pynvml.NVML_DEVICE_MIG_ENABLE:
            whole.append(uuid)
            continue
        for m in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, m)
            except pynvml.NVMLError_NotFound:
                continue
            migs.append(
                (
                    uuid,
                    text(pynvml.nvmlDeviceGetUUID(mig)),
                    int(pynvml.nvmlDeviceGetGpuInstanceId(mig)),
                    int(pynvml.nvmlDeviceGetComputeInstanceId(mig)),
                )
            )
    return Inventory(modes, whole, migs)


@contextmanager
def worker(device: str, size: int) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A CUDA child holding `size` bytes on `device` (a GPU or MIG UUID) as its cuda:0."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": device, "HF_TOKEN": SECRET}
    child = subprocess.Popen(
        ["bash", "-c", f'exec -a {TITLE} "{sys.executable}" -c "$0" "$1"', CHILD, str(size)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert child.stdout is not None
        torch_uuid = child.stdout.readline().strip()
        time.sleep(1)
        yield child, torch_uuid
    finally:
        child.kill()
        child.wait()


def read_ledger() -> tuple[NvmlSnapshot, Ledger]:
    """One cycle of the real NVML and procfs sources, joined."""
    source = NvmlSource()
    try:
        nvml = source.fetch()
    finally:
        source.close()
    procs = ProcfsSource("/proc").fetch(Snapshots({NVML: nvml}))
    snapshots = Snapshots({NVML: nvml, PROCESSES: procs})
    return nvml, build_ledger(snapshots, node="gpu-check", mode="node", taken_at=time.time())


def check_process(ledger: Ledger, pid: int, device: str, size: int) -> list[str]:
    """The child in the ledger: its title, its memory on `device` only, cuda:0 = `device`."""
    view = {p.pid: p for p in ledger.processes}.get(pid)
    if view is None:
        return [f"child pid {pid} not among NVML's processes"]
    print(
        f"  child seen: title={view.title!r} gpu_memory={view.gpu_memory} "
        f"cuda_devices={view.cuda_devices}"
    )
    failures = []
    if view.title != TITLE:
        failures.append(f"title {view.title!r} != {TITLE!r}")
    held = dict(view.gpu_memory)
    if set(held) != {device}:
        failures.append(f"child on {set(held)}, expected {device}")
    used = held.get(device) or 0
    if not size <= used <= size + 2048 * MiB:  # plus the CUDA context
        failures.append(f"child memory {used} bytes, expected {size} plus a context")
    if not view.cuda_devices or view.cuda_devices[0] != device:
        failures.append(f"cuda:0 maps to {view.cuda_devices}, expected {device} first")
    if SECRET in repr(ledger):
        failures.append("secret environment value reached the ledger")
    return failures


def check_whole_gpu(found: Inventory) -> list[str]:
    if not found.whole:
        print("whole GPU: every GPU is in MIG mode; the whole-GPU check was not run")
        return []
    device, size = found.whole[-1], 1024 * MiB
    print(f"whole GPU: {device}")
    with worker(device, size) as (child, torch_uuid):
        nvml, ledger = read_ledger()
        print(f"  driver {nvml.driver_version}, {len(nvml.gpus)} GPU(s); child pid {child.pid}")
        failures = check_process(ledger, child.pid, device, size)
        if torch_uuid and torch_uuid not in device:
            failures.append(f"torch cuda:0 uuid {torch_uuid} is not {device}")
    return failures


def check_mig_device(found: Inventory) -> list[str]:
    in_mig = [u for u, mode in found.modes.items() if mode and mode[0]]
    if not found.migs:
        where = (
            f"MIG mode is on for {', '.join(in_mig)} but" if in_mig else "no GPU is in MIG mode:"
        )
        print(
            f"MIG: {where} this machine has no MIG device; the MIG check was not run (no failure)"
        )
        return []
    parent, device, gi, ci = found.migs[0]
    size = 256 * MiB
    print(f"MIG: {device} (GPU {parent}, GPU instance {gi}, compute instance {ci})")
    with worker(device, size) as (child, torch_uuid):
        nvml, ledger = read_ledger()
        failures = check_process(ledger, child.pid, device, size)
        failures += check_mig_view(nvml, ledger, (parent, device, gi, ci), child.pid)
        if torch_uuid and torch_uuid.removeprefix("MIG-") not in device:
            print(f"  note: torch names cuda:0 {torch_uuid} (not compared: CUDA's own form)")
    return failures


def check_mig_view(
    nvml: NvmlSnapshot, ledger: Ledger, expected: tuple[str, str, int, int], pid: int
) -> list[str]:
    parent, device, gi, ci = expected
    gpu = next((g for g in nvml.gpus if g.uuid == parent), None)
    mig = next((m for m in gpu.mig_devices if m.uuid == device), None) if gpu else None
    if gpu is None or mig is None:
        return [f"MIG device {device} not under GPU {parent} in the NVML snapshot"]
    print(f"  NVML source: {mig}")
    failures = []
    if (mig.gpu_instance_id, mig.compute_instance_id) != (gi, ci):
        failures.append(
            f"instance ids {mig.gpu_instance_id}/{mig.compute_instance_id} != {gi}/{ci}"
        )
    if not mig.profile or "g." not in mig.profile:
        failures.append(f"no MIG profile read: {mig.profile!r}")
    if any(p.pid == pid for p in gpu.processes):
        failures.append("the process is listed on the GPU as well as on its MIG device")
    if gpu.utilization_ratio is not None:
        failures.append("a GPU in MIG mode reports utilization: NVML should not")
    exposition = render_text(snapshot_families(Published(ledger), time.time())).decode()
    wanted = f'gpu_uuid="{device}"'
    rows = [
        line
        for line in exposition.splitlines()
        if line.startswith("gpuledger_gpu_memory_used_bytes{") and wanted in line
    ]
    if len(rows) != 1 or f'parent_gpu_uuid="{parent}"' not in rows[0]:
        failures.append(f"MIG memory series wrong: {rows}")
    return failures


LEVELS = {
    pynvml.NVML_TOPOLOGY_INTERNAL: "internal",
    pynvml.NVML_TOPOLOGY_SINGLE: "single",
    pynvml.NVML_TOPOLOGY_MULTIPLE: "multiple",
    pynvml.NVML_TOPOLOGY_HOSTBRIDGE: "hostbridge",
    pynvml.NVML_TOPOLOGY_NODE: "node",
    pynvml.NVML_TOPOLOGY_SYSTEM: "system",
}


def pair_of(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a < b else (b, a)


def raw_nvlinks(handle: object) -> tuple[list[tuple[int, str, str]], str]:
    """The GPU's active NVLinks as (link, far end's bus id, its type), and a note on what
    the other links answered."""
    active: list[tuple[int, str, str]] = []
    answers: dict[str, int] = {}
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            state = pynvml.nvmlDeviceGetNvLinkState(handle, link)
        except pynvml.NVMLError as exc:
            answers[str(exc)] = answers.get(str(exc), 0) + 1
            continue
        answers[f"state {state}"] = answers.get(f"state {state}", 0) + 1
        if state != pynvml.NVML_FEATURE_ENABLED:
            continue
        try:
            far = text(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
        except pynvml.NVMLError as exc:
            far = f"? ({exc})"
        try:
            kind = str(pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link))
        except pynvml.NVMLError as exc:
            kind = f"? ({exc})"
        active.append((link, far, kind))
    return active, ", ".join(f"{n} x {what}" for what, n in sorted(answers.items()))


def check_topology() -> list[str]:
    """NVML's topology calls printed as they answer, and the source's pairs against them."""
    count = min(pynvml.nvmlDeviceGetCount(), MAX_TOPOLOGY_GPUS)
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    uuids = [text(pynvml.nvmlDeviceGetUUID(h)) for h in handles]
    buses = [text(pynvml.nvmlDeviceGetPciInfo_v3(h).busId) for h in handles]
    peers: set[tuple[str, str]] = set()
    for i, h in enumerate(handles):
        active, answers = raw_nvlinks(h)
        print(f"topology: GPU {i} {uuids[i]} ({buses[i]}): NVLink calls: {answers}")
        for link, far, kind in active:
            print(f"  link {link} -> {far} (type {kind})")
            if far in buses:
                peers.add(pair_of(uuids[i], uuids[buses.index(far)]))
    raw: dict[tuple[str, str], str | None] = {}
    for i in range(count):
        for j in range(i + 1, count):
            try:
                level: str | None = LEVELS.get(
                    int(pynvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j]))
                )
            except pynvml.NVMLError as exc:
                level = None
                print(f"  GPU {i} - GPU {j}: common ancestor failed: {exc}")
            print(f"  GPU {i} - GPU {j}: common ancestor {level}")
            raw[pair_of(uuids[i], uuids[j])] = level
    if count < 2:
        print("topology: one GPU, no pair to compare (no failure)")
        return []
    nvml, _ = read_ledger()
    links = {pair_of(x.a, x.b): x for x in nvml.links}
    failures = []
    if set(links) != set(raw):
        failures.append(f"the source read {len(links)} pairs, NVML has {len(raw)}")
    for pair, level in raw.items():
        got = links.get(pair)
        if got is None:
            continue
        print(f"  source: {pair[0]} - {pair[1]}: {got.link}")
        if got.common_ancestor != level:
            failures.append(f"{pair}: source says {got.common_ancestor}, NVML {level}")
        if pair in peers and got.nvlink is not True:
            failures.append(f"{pair}: an NVLink joins them, the source says {got.nvlink}")
    return failures


def main() -> int:
    pynvml.nvmlInit()
    before = inventory()
    failures = check_whole_gpu(before)
    failures += check_mig_device(before)
    failures += check_topology()
    after = inventory()
    if after.modes != before.modes:  # read-only: nothing may have changed a MIG setting
        failures.append(f"MIG modes changed during the check: {before.modes} -> {after.modes}")
    pynvml.nvmlShutdown()
    for failure in failures:
        print("FAIL:", failure)
    print("PASS" if not failures else "FAIL")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
