"""Simulated sources for tests, the demo and `gpuledger simulate`."""
