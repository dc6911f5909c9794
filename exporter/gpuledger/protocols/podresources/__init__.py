"""PodResources v1 messages and stubs, used by the source and by the simulated kubelet."""
