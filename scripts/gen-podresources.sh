#!/usr/bin/env bash
# Regenerate the kubelet PodResources v1 Python modules from
# exporter/gpuledger/protocols/podresources/api.proto. The output is committed, so the
# exporter image needs neither protoc nor grpcio-tools.
#
# Needs (dev only): grpcio-tools (its bundled protoc fixes the protobuf/grpcio runtime
# floor written into the output) and mypy-protobuf (typed .pyi stubs for mypy --strict).
#   pip install grpcio-tools mypy-protobuf
# Usage: scripts/gen-podresources.sh [python]   (default: .venv/bin/python, else python3)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${1:-}"
if [[ -z "$python" ]]; then
  if [[ -x "$root/.venv/bin/python" ]]; then python="$root/.venv/bin/python"; else python=python3; fi
fi
# protoc-gen-mypy / protoc-gen-mypy_grpc are console scripts next to that interpreter.
bindir="$(dirname "$("$python" -c 'import sys; print(sys.executable)')")"
export PATH="$bindir:$PATH"

pkg=gpuledger/protocols/podresources
cd "$root/exporter"
# -I exporter makes the modules import each other as gpuledger.sources.podresources.*
"$python" -m grpc_tools.protoc -I . \
  --python_out=. --grpc_python_out=. \
  --mypy_out=. --mypy_grpc_out=. \
  "$pkg/api.proto"

# The exact command (run from the repository root) goes into every output file.
cmd="python -m grpc_tools.protoc -I exporter --python_out=exporter --grpc_python_out=exporter --mypy_out=exporter --mypy_grpc_out=exporter exporter/$pkg/api.proto"
header="# Generated from api.proto by scripts/gen-podresources.sh; do not edit. Equivalent to:
#   $cmd
# ruff: noqa"
for f in api_pb2.py api_pb2_grpc.py api_pb2.pyi api_pb2_grpc.pyi; do
  { printf '%s\n' "$header"; cat "$pkg/$f"; } > "$pkg/$f.tmp"
  mv "$pkg/$f.tmp" "$pkg/$f"
done
echo "regenerated $pkg/api_pb2{,_grpc}.py{,i}"
