#!/usr/bin/env bash
# Real-GPU check of the NVML + procfs sources (never needed by CI): a process on a whole
# GPU, and on a MIG device where the machine has one (read-only: no MIG setting is changed;
# without a MIG device it says so, which is no failure), and NVML's topology calls (common
# ancestor per GPU pair, NVLink state and far ends), read-only, against the NVML source.
# Needs: an NVIDIA driver, python3 with a CUDA build of torch, and nvidia-ml-py
# (installed from ./.whl/ offline when present). Prints PASS or FAIL; exit 0 on PASS.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c 'import pynvml, prometheus_client, yaml' 2>/dev/null; then
  if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --find-links .whl nvidia-ml-py prometheus-client PyYAML
  else
    echo "FAIL: nvidia-ml-py / prometheus-client / PyYAML not importable and no .whl/ to install from"
    exit 1
  fi
fi
"$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
  || { echo "FAIL: torch cannot see a CUDA device"; exit 1; }
export PYTHONPATH=exporter
exec timeout 280 "$PY" scripts/gpu_check.py
