"""Real-GPU check: a real CUDA process must come out of the real sources as it is.

Starts a child under the title `gpuledger-check-worker` that allocates 1 GiB on cuda:0 with
CUDA_VISIBLE_DEVICES pointing at the *last* GPU (so cuda:0 != host index 0 on multi-GPU
machines), then checks PID, title, GPU UUID, memory and the cuda:0 -> UUID mapping.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pynvml

from gpuledger.ledger import build_ledger
from gpuledger.sources.nvml import NvmlSource
from gpuledger.sources.procfs import ProcfsSource

TITLE = "gpuledger-check-worker"
GiB = 1024**3
CHILD = """
import sys, time, torch
x = torch.empty(1024**3, dtype=torch.uint8, device="cuda:0")
torch.cuda.synchronize()
print(str(torch.cuda.get_device_properties(0).uuid), flush=True)
time.sleep(120)
"""


def main() -> int:
    pynvml.nvmlInit()
    last = pynvml.nvmlDeviceGetCount() - 1
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(last), "HF_TOKEN": "hf_gpucheck_secret"}
    child = subprocess.Popen(
        ["bash", "-c", f'exec -a {TITLE} "{sys.executable}" -c "$0"', CHILD],
        stdout=subprocess.PIPE, text=True, env=env,
    )
    failures: list[str] = []
    try:
        assert child.stdout is not None
        torch_uuid = child.stdout.readline().strip()
        time.sleep(1)
        source = NvmlSource()
        nvml = source.fetch()
        pids = [p.pid for g in nvml.gpus for p in g.processes]
        procs = ProcfsSource("/proc").fetch(pids)
        ledger = build_ledger(node="gpu-check", mode="node", taken_at=time.time(),
                              nvml=nvml, procs=procs, sources=())
        print(f"driver {nvml.driver_version}, {len(nvml.gpus)} GPU(s); child pid {child.pid}")
        expected = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(last))
        expected = expected.decode() if isinstance(expected, bytes) else expected
        if torch_uuid and torch_uuid not in expected:
            failures.append(f"torch cuda:0 uuid {torch_uuid} is not NVML index {last} {expected}")
        view = {p.pid: p for p in ledger.processes}.get(child.pid)
        if view is None:
            failures.append(f"child pid {child.pid} not among NVML processes {sorted(pids)}")
        else:
            print(f"child seen: title={view.title!r} gpu_memory={view.gpu_memory} "
                  f"cuda_devices={view.cuda_devices}")
            if view.title != TITLE:
                failures.append(f"title {view.title!r} != {TITLE!r}")
            held = dict(view.gpu_memory)
            if set(held) != {expected}:
                failures.append(f"child on {set(held)}, expected {expected}")
            used = held.get(expected) or 0
            if not GiB <= used <= 3 * GiB:
                failures.append(f"child memory {used} bytes, expected 1-3 GiB")
            if not view.cuda_devices or view.cuda_devices[0] != expected:
                failures.append(f"cuda:0 maps to {view.cuda_devices}, expected {expected} first")
        exposition = repr(ledger)
        if "hf_gpucheck_secret" in exposition:
            failures.append("secret environment value reached the ledger")
        source.close()
    finally:
        child.kill()
        child.wait()
    for failure in failures:
        print("FAIL:", failure)
    print("PASS" if not failures else "FAIL")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
