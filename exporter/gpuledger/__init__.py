"""gpuledger: one ledger of every GPU, joined across Kubernetes, Ray, vLLM and NVML."""

__version__ = "0.1.0"
