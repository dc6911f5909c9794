"""The `gpuledger` command: one module per subcommand (serve, explain, demo and simulate),
every flag in flags.py."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from gpuledger.cli.explain import run_explain
from gpuledger.cli.flags import BOOLEAN_VARIABLES, _env, build_parser
from gpuledger.cli.serve import run_exporter, serve_config
from gpuledger.cli.simulate import run_scenario_command
from gpuledger.logs import setup_logging

__all__ = ["kubectl_main", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # --help exits here, whatever the environment holds
    for name in BOOLEAN_VARIABLES:
        value = _env(name)
        if value is not None and value.strip().lower() not in ("true", "false", ""):
            parser.error(f"GPULEDGER_{name}={value[:40]!r}: expected true or false")
    setup_logging(args.log_level, args.log_format)
    if args.command == "serve":
        return run_exporter(serve_config(args), args)
    if args.command == "explain":
        return run_explain(args)
    return run_scenario_command(args)


def kubectl_main(argv: Sequence[str] | None = None) -> int:
    """`kubectl gpuledger ARGS` (the kubectl-gpuledger plugin) is `gpuledger explain ARGS`."""
    return main(["explain", *(sys.argv[1:] if argv is None else argv)])
