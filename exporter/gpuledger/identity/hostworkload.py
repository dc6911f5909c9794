"""The workload of an engine in no pod (docs/design.md, identity rule 7). Pure.

Without Kubernetes there is no owner to name, but an engine still needs a workload for
the stage rules, the engine alerts and explain to judge it as they judge a pod's. Its
namespace is empty (as Ray's outside Kubernetes, `--ray-workload`), and its workload is,
in this order:

1. the systemd service unit its API server runs in (`vllm-a.service`, from its cgroup,
   identity/cgroup.py), where that server holds the target's socket: what the operator
   named, stable across restarts;
2. the workload it had in the previous cycle: an engine that stops answering, or whose
   API server is gone, keeps its workload (its series go to up=0 and it is `starting`,
   not a new workload);
3. the unit of the host's only API server where the sockets did not tie the target to
   it (identity rule 6's old rule, `only_api_server`: a proxy in front, or a stopped
   engine next to a running one, which must not take its sibling's name);
4. its target (`host:port[/path]`), a loopback or any-address host replaced by the node's
   name: `127.0.0.1:8000` on two hosts are two engines, not one workload.
"""

from __future__ import annotations

import ipaddress

_LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain"})


def _is_local(host: str) -> bool:
    if host.lower() in _LOCAL_NAMES:
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return ip.is_loopback or ip.is_unspecified


def target_workload(endpoint: str, node: str) -> str:
    """`127.0.0.1:8000` on node `box` -> `box:8000`; a routable `10.0.0.5:8000` as is."""
    address, slash, path = endpoint.partition("/")
    host, sep, port = address.rpartition(":")
    if not sep or not _is_local(host.strip("[]")) or not node:
        return endpoint
    return f"{node}:{port}{slash}{path}"


def host_engine_workload(
    unit: str | None, previous: str | None, endpoint: str, node: str, *, by_socket: bool
) -> str:
    """The workload of an engine in no pod (see the module docstring): `unit` is its API
    server's, `by_socket` whether that server holds the target's socket."""
    return (unit if by_socket else None) or previous or unit or target_workload(endpoint, node)
