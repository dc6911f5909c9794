"""kubelet wire protocols, generated from their .proto files (scripts/gen-podresources.sh)."""
