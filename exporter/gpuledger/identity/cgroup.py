"""Process -> Pod identity from `/proc/<pid>/cgroup` (docs/design.md, identity rule 2).

The cgroup path is the only trustworthy link from a process to its Pod: environment
variables can be stripped or forged, the cgroup is set by the kubelet and the runtime.

Shapes handled (any prefix before them is ignored, so nested setups such as kind,
docker-in-docker or a custom `--cgroup-root` work, as do namespace-relative paths
with `..` components):

* systemd driver: `kubepods[-<qos>]-pod<uid_with_underscores>.slice/<leaf>` where the
  slice name may carry extra parents (`kubelet-kubepods-besteffort-pod…` in kind);
* cgroupfs driver: `[<qos>/]pod<uid>/<leaf>`;
* leaves: `cri-containerd-<id>.scope`, `crio-<id>.scope`, `docker-<id>.scope`,
  `crio-<id>` (cri-o on cgroupfs), a bare `<id>` (containerd/docker on cgroupfs), and
  `crio-conmon-<id>.scope` (the monitor, not the container).

A process in no pod keeps the systemd service unit its cgroup names, the innermost
`<name>.service` component (`/system.slice/vllm-a.service`, a user unit under
`user@1000.service/app.slice/vllm.service`): what names a workload on a host without
Kubernetes (identity rule 7). A `.scope` (a login session, a docker container) is no
unit: its name changes from one start to the next; nor is `user@<uid>.service`, the
user's service manager, which holds every app of that user.

Pod UIDs are normally dashed UUIDs. Static pods have a 32-hex UID (an md5 of the
manifest, equal to the mirror pod's `kubernetes.io/config.hash` annotation); that form
is kept as is, since adding dashes would match nothing.
"""

from __future__ import annotations

import functools
import re

from gpuledger.model.procfs import NO_IDENTITY, CgroupIdentity

__all__ = [
    "NO_IDENTITY",
    "CgroupIdentity",
    "parse_cgroup_file",
    "parse_cgroup_path",
    "systemd_unit",
]


_DASHED_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_STATIC_UID = re.compile(r"[0-9a-f]{32}")
# systemd encodes every parent in the slice name, joined by "-", so the uid's own dashes
# become underscores. Group 1 is the parent chain, e.g. "kubepods-burstable-".
_SYSTEMD_POD = re.compile(r"((?:[a-z0-9_.]+-)*)pod([0-9a-f_]{32,36})\.slice")
_CGROUPFS_POD = re.compile(r"pod([0-9a-f-]{32,36})")
_CONTAINER = re.compile(r"(?:(cri-containerd|crio|docker)-)?([0-9a-f]{64})(?:\.scope)?")
_CONMON = re.compile(r"crio-conmon-[0-9a-f]{64}(?:\.scope)?")
_RUNTIMES = {"cri-containerd": "containerd", "crio": "cri-o", "docker": "docker"}
_QOS_CLASSES = ("burstable", "besteffort")
# A systemd service unit name (systemd.unit(5): letters, digits, `:-_.\\`, `@` for
# template instances), at most 255 characters.
_UNIT = re.compile(r"[A-Za-z0-9:_.@\\-]{1,247}\.service")
_USER_MANAGER = re.compile(r"user@\d+\.service")
# cgroup v2 marks a removed cgroup this way (a process that outlived its container).
_DELETED_SUFFIX = " (deleted)"


def _valid_uid(candidate: str) -> str | None:
    if _DASHED_UUID.fullmatch(candidate) or _STATIC_UID.fullmatch(candidate):
        return candidate
    return None


def _pod_component(component: str, parent: str | None) -> tuple[str, str | None] | None:
    """(pod_uid, qos) if this path component is a pod cgroup, else None."""
    m = _SYSTEMD_POD.fullmatch(component)
    if m is not None:
        chain = m.group(1).split("-")
        if "kubepods" not in chain:
            return None
        uid = _valid_uid(m.group(2).replace("_", "-"))
        if uid is None:
            return None
        qos = next((q for q in _QOS_CLASSES if q in chain), "guaranteed")
        return uid, qos
    m = _CGROUPFS_POD.fullmatch(component)
    if m is not None:
        uid = _valid_uid(m.group(1))
        if uid is None:
            return None
        # The QoS level is the parent directory; guaranteed pods sit directly under
        # kubepods. A parent hidden by a cgroup namespace (".." or nothing) is unknown.
        if parent in _QOS_CLASSES:
            return uid, parent
        if parent is not None and parent.endswith("kubepods"):
            return uid, "guaranteed"
        return uid, None
    return None


def _container_component(component: str | None) -> tuple[str | None, str | None]:
    """(container_id, runtime) for the component under the pod cgroup."""
    if component is None:
        return None, None
    if _CONMON.fullmatch(component):
        return None, "cri-o"
    m = _CONTAINER.fullmatch(component)
    if m is None:
        return None, None
    prefix = m.group(1)
    return m.group(2), (_RUNTIMES[prefix] if prefix else None)


def parse_cgroup_path(path: str) -> CgroupIdentity:
    """Pod and container identity from one cgroup path; NO_IDENTITY when not in a pod.

    Never raises. The last (innermost) pod component wins, so Kubernetes nested inside
    a pod (kind in a pod) resolves to the inner pod.
    """
    path = path.strip()
    if path.endswith(_DELETED_SUFFIX):
        path = path[: -len(_DELETED_SUFFIX)].rstrip()
    components = [c for c in path.lower().split("/") if c and c != "."]
    for i in range(len(components) - 1, -1, -1):
        parent = components[i - 1] if i > 0 and components[i - 1] != ".." else None
        pod = _pod_component(components[i], parent)
        if pod is None:
            continue
        leaf = components[i + 1] if i + 1 < len(components) else None
        container_id, runtime = _container_component(leaf)
        return CgroupIdentity(pod[0], container_id, runtime, pod[1])
    return NO_IDENTITY


def systemd_unit(path: str) -> str | None:
    """The innermost systemd service unit of a cgroup path (`vllm-a.service`); None when
    the path names none (a `.scope`, cgroupfs, the root). Case is kept: unit names are."""
    path = path.strip().removesuffix(_DELETED_SUFFIX).rstrip()
    for component in reversed(path.split("/")):
        if _UNIT.fullmatch(component) and not _USER_MANAGER.fullmatch(component):
            return component
    return None


# The processes of a container share one cgroup file, and it does not change from cycle to
# cycle: parsing each distinct text once was a quarter of procfs's own CPU on a dense node.
@functools.lru_cache(maxsize=4096)
def parse_cgroup_file(text: str) -> CgroupIdentity:
    """Identity from the whole content of `/proc/<pid>/cgroup` (v1, v2 or hybrid).

    The v2 line (`0::/path`) is preferred; otherwise the first v1 line whose path names a
    pod. Which v1 controller that is does not matter: the kubelet puts a pod in the same
    path in every hierarchy. Malformed lines are skipped; never raises. A process in no
    pod gets the systemd unit of the v2 path, else of v1's `name=systemd` hierarchy.
    """
    v1_paths: list[str] = []
    unit: str | None = None
    for line in text.splitlines():
        hierarchy, sep, rest = line.strip().partition(":")
        controllers, sep2, path = rest.partition(":")
        if not (sep and sep2) or not hierarchy.isascii() or not hierarchy.isdigit():
            continue
        if hierarchy == "0" and controllers == "":
            identity = parse_cgroup_path(path)
            if identity.pod_uid is not None:
                return identity
            unit = systemd_unit(path) or unit
        else:
            v1_paths.append(path)
            if unit is None and controllers == "name=systemd":
                unit = systemd_unit(path)
    for path in v1_paths:
        identity = parse_cgroup_path(path)
        if identity.pod_uid is not None:
            return identity
    return NO_IDENTITY if unit is None else CgroupIdentity(None, None, None, None, unit)
