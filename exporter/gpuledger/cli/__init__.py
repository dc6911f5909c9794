"""The `gpuledger` command: one module per subcommand, flags in one place."""

from gpuledger.cli.main import kubectl_main, main

__all__ = ["kubectl_main", "main"]
