"""Process -> Pod identity from /proc/<pid>/cgroup (identity rule 2)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuledger.identity.cgroup import (
    NO_IDENTITY,
    CgroupIdentity,
    parse_cgroup_file,
    parse_cgroup_path,
    systemd_unit,
)

UID = "0b9a8c3e-1f2d-4e5a-8b6c-7d8e9f0a1b2c"
UID_ = UID.replace("-", "_")
CID = "4f1c2d3e5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d"
STATIC_UID = "c4e1d2f3a5b6978812ab34cd56ef7890"  # md5-style UID of a static pod

PATH_CASES: list[tuple[str, str, CgroupIdentity]] = [
    # --- systemd driver (cgroup v2 and v1 name=systemd) ---
    (
        "systemd burstable containerd",
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice"
        f"/cri-containerd-{CID}.scope",
        CgroupIdentity(UID, CID, "containerd", "burstable"),
    ),
    (
        "systemd besteffort containerd",
        f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice"
        f"/cri-containerd-{CID}.scope",
        CgroupIdentity(UID, CID, "containerd", "besteffort"),
    ),
    (
        "systemd guaranteed has no qos slice",
        f"/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope",
        CgroupIdentity(UID, CID, "containerd", "guaranteed"),
    ),
    (
        "systemd cri-o",
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice"
        f"/crio-{CID}.scope",
        CgroupIdentity(UID, CID, "cri-o", "burstable"),
    ),
    (
        "systemd cri-o with crun's container subgroup",
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice"
        f"/crio-{CID}.scope/container",
        CgroupIdentity(UID, CID, "cri-o", "burstable"),
    ),
    (
        "systemd cri-o conmon is not the container",
        f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice"
        f"/crio-conmon-{CID}.scope",
        CgroupIdentity(UID, None, "cri-o", "besteffort"),
    ),
    (
        "systemd docker (cri-dockerd)",
        f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice"
        f"/docker-{CID}.scope",
        CgroupIdentity(UID, CID, "docker", "besteffort"),
    ),
    (
        "systemd pod-level process, no container leaf",
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice",
        CgroupIdentity(UID, None, None, "burstable"),
    ),
    (
        "systemd static pod (md5 uid, no dashes)",
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{STATIC_UID}.slice"
        f"/cri-containerd-{CID}.scope",
        CgroupIdentity(STATIC_UID, CID, "containerd", "burstable"),
    ),
    # --- cgroupfs driver ---
    (
        "cgroupfs burstable bare id",
        f"/kubepods/burstable/pod{UID}/{CID}",
        CgroupIdentity(UID, CID, None, "burstable"),
    ),
    (
        "cgroupfs guaranteed",
        f"/kubepods/pod{UID}/{CID}",
        CgroupIdentity(UID, CID, None, "guaranteed"),
    ),
    (
        "cgroupfs besteffort",
        f"/kubepods/besteffort/pod{UID}/{CID}",
        CgroupIdentity(UID, CID, None, "besteffort"),
    ),
    (
        "cgroupfs cri-o prefix",
        f"/kubepods/burstable/pod{UID}/crio-{CID}",
        CgroupIdentity(UID, CID, "cri-o", "burstable"),
    ),
    (
        "cgroupfs pod level",
        f"/kubepods/besteffort/pod{UID}",
        CgroupIdentity(UID, None, None, "besteffort"),
    ),
    (
        "cgroupfs static pod",
        f"/kubepods/burstable/pod{STATIC_UID}/{CID}",
        CgroupIdentity(STATIC_UID, CID, None, "burstable"),
    ),
    # --- nested prefixes ---
    (
        "kind systemd nested slice",
        f"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice"
        f"/kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope",
        CgroupIdentity(UID, CID, "containerd", "besteffort"),
    ),
    (
        "kind guaranteed nested slice",
        f"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod{UID_}.slice"
        f"/cri-containerd-{CID}.scope",
        CgroupIdentity(UID, CID, "containerd", "guaranteed"),
    ),
    (
        "kind cgroupfs",
        f"/kubelet/kubepods/burstable/pod{UID}/{CID}",
        CgroupIdentity(UID, CID, None, "burstable"),
    ),
    (
        "kind cgroupfs guaranteed",
        f"/kubelet/kubepods/pod{UID}/{CID}",
        CgroupIdentity(UID, CID, None, "guaranteed"),
    ),
    (
        "docker-in-docker cgroupfs",
        f"/docker/{'ab' * 32}/kubepods/besteffort/pod{UID}/{CID}",
        CgroupIdentity(UID, CID, None, "besteffort"),
    ),
    (
        "docker-in-docker systemd (minikube)",
        f"/docker/{'cd' * 32}/kubepods.slice/kubepods-besteffort.slice"
        f"/kubepods-besteffort-pod{UID_}.slice/crio-{CID}.scope",
        CgroupIdentity(UID, CID, "cri-o", "besteffort"),
    ),
    # --- relative paths under a cgroup namespace ---
    (
        "cgroupns relative systemd",
        f"/../../kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope",
        CgroupIdentity(UID, CID, "containerd", "besteffort"),
    ),
    (
        "cgroupns relative without leading slash",
        f"../kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope",
        CgroupIdentity(UID, CID, "containerd", "guaranteed"),
    ),
    (
        "cgroupns relative cgroupfs, qos hidden",
        f"/../../pod{UID}/{CID}",
        CgroupIdentity(UID, CID, None, None),
    ),
    (
        "cgroupns relative cgroupfs, qos visible",
        f"/../burstable/pod{UID}/{CID}",
        CgroupIdentity(UID, CID, None, "burstable"),
    ),
    # --- normalisation and oddities ---
    (
        "uppercase hex",
        f"/kubepods/burstable/pod{UID.upper()}/{CID.upper()}",
        CgroupIdentity(UID, CID, None, "burstable"),
    ),
    (
        "removed cgroup marked deleted",
        f"/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope (deleted)",
        CgroupIdentity(UID, CID, "containerd", "guaranteed"),
    ),
    (
        "leaf that is no container id",
        f"/kubepods/burstable/pod{UID}/not-a-container",
        CgroupIdentity(UID, None, None, "burstable"),
    ),
    (
        "short container id is not an id",
        f"/kubepods/burstable/pod{UID}/{CID[:12]}",
        CgroupIdentity(UID, None, None, "burstable"),
    ),
    (
        "kind inside a pod: innermost pod wins",
        f"/kubepods/burstable/pod{'1' * 8}-1111-1111-1111-{'1' * 12}/{'e' * 64}"
        f"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod{UID_}.slice"
        f"/cri-containerd-{CID}.scope",
        CgroupIdentity(UID, CID, "containerd", "guaranteed"),
    ),
    # --- not a pod ---
    ("host service", "/system.slice/containerd.service", NO_IDENTITY),
    ("user session", "/user.slice/user-1000.slice/session-2.scope", NO_IDENTITY),
    ("namespace root", "/", NO_IDENTITY),
    ("empty", "", NO_IDENTITY),
    ("kubepods root", "/kubepods.slice", NO_IDENTITY),
    ("qos slice only", "/kubepods.slice/kubepods-burstable.slice", NO_IDENTITY),
    ("plain docker container", f"/system.slice/docker-{CID}.scope", NO_IDENTITY),
    ("pod slice outside kubepods", f"/system.slice/foo-pod{UID_}.slice", NO_IDENTITY),
    ("truncated uid", f"/kubepods/burstable/pod{UID[:-1]}/{CID}", NO_IDENTITY),
    ("uid with wrong dash layout", f"/kubepods/burstable/pod{UID_}/{CID}", NO_IDENTITY),
]


@pytest.mark.parametrize(
    ("path", "expected"), [(p, e) for _, p, e in PATH_CASES], ids=[n for n, _, _ in PATH_CASES]
)
def test_parse_cgroup_path(path: str, expected: CgroupIdentity) -> None:
    assert parse_cgroup_path(path) == expected


V1_BURSTABLE = (
    "\n".join(
        f"{n}:{c}:/kubepods/burstable/pod{UID}/{CID}"
        for n, c in [
            (12, "memory"),
            (11, "cpu,cpuacct"),
            (10, "pids"),
            (9, "devices"),
        ]
    )
    + f"\n1:name=systemd:/kubepods/burstable/pod{UID}/{CID}\n"
)

FILE_CASES: list[tuple[str, str, CgroupIdentity]] = [
    (
        "v2 only",
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice"
        f"/cri-containerd-{CID}.scope\n",
        CgroupIdentity(UID, CID, "containerd", "burstable"),
    ),
    ("v1 cgroupfs", V1_BURSTABLE, CgroupIdentity(UID, CID, None, "burstable")),
    (
        "v1 systemd driver, some controllers at root",
        "13:freezer:/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{UID_}.slice/crio-{CID}.scope\n"
        "11:files:/\n"
        "10:hugetlb:/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{UID_}.slice/crio-{CID}.scope\n"
        "1:name=systemd:/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{UID_}.slice/crio-{CID}.scope\n",
        CgroupIdentity(UID, CID, "cri-o", "burstable"),
    ),
    (
        "v1 only name=systemd names the pod",
        "12:memory:/\n11:cpu,cpuacct:/\n"
        f"1:name=systemd:/kubepods.slice/kubepods-pod{UID_}.slice/docker-{CID}.scope\n",
        CgroupIdentity(UID, CID, "docker", "guaranteed"),
    ),
    (
        "hybrid: v2 line preferred over v1",
        f"12:memory:/kubepods/burstable/pod{UID}/{'f' * 64}\n"
        f"0::/kubepods/besteffort/pod{UID}/{CID}\n",
        CgroupIdentity(UID, CID, None, "besteffort"),
    ),
    (
        "hybrid: v2 line without pod falls back to v1",
        f"12:memory:/kubepods/burstable/pod{UID}/{CID}\n0::/init.scope\n",
        CgroupIdentity(UID, CID, None, "burstable"),
    ),
    (
        "first v1 line with a pod wins",
        f"5:memory:/kubepods/burstable/pod{UID}/{CID}\n"
        f"4:cpu:/kubepods/besteffort/pod{UID}/{'a' * 64}\n",
        CgroupIdentity(UID, CID, None, "burstable"),
    ),
    # In no pod: the systemd service unit, a bare host's workload (identity rule 7).
    (
        "host containerd",
        "0::/system.slice/containerd.service\n",
        CgroupIdentity(None, None, None, None, "containerd.service"),
    ),
    (
        "host unit, cgroup v1",
        "12:pids:/system.slice/vllm-b.service\n1:name=systemd:/system.slice/vllm-b.service\n0::/\n",
        CgroupIdentity(None, None, None, None, "vllm-b.service"),
    ),
    ("host session", "0::/user.slice/user-1000.slice/session-2.scope\n", NO_IDENTITY),
    ("cgroupns root", "0::/\n", NO_IDENTITY),
    (
        "cgroupns relative",
        f"0::/../../kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
        CgroupIdentity(UID, CID, "containerd", "besteffort"),
    ),
    (
        "garbage lines skipped",
        f"garbage\n\nx:y:/kubepods/pod{UID}/{CID}\n:::\n0::/kubepods/pod{UID}/{CID}\r\n",
        CgroupIdentity(UID, CID, None, "guaranteed"),
    ),
    (
        "path containing a colon",
        f"0::/kubepods/pod{UID}/{CID}/odd:name\n",
        CgroupIdentity(UID, CID, None, "guaranteed"),
    ),
    ("empty file", "", NO_IDENTITY),
]


@pytest.mark.parametrize(
    ("text", "expected"), [(t, e) for _, t, e in FILE_CASES], ids=[n for n, _, _ in FILE_CASES]
)
def test_parse_cgroup_file(text: str, expected: CgroupIdentity) -> None:
    assert parse_cgroup_file(text) == expected


@given(st.text())
def test_arbitrary_path_never_raises(text: str) -> None:
    assert isinstance(parse_cgroup_path(text), CgroupIdentity)


@given(st.text())
def test_arbitrary_file_never_raises(text: str) -> None:
    assert isinstance(parse_cgroup_file(text), CgroupIdentity)


_CGROUPISH = st.text(alphabet="0123456789abcdefABCDEF:/-_.kubepodsliceprntr \n", max_size=300)


@given(_CGROUPISH)
def test_cgroup_like_text_never_raises(text: str) -> None:
    assert isinstance(parse_cgroup_file(text), CgroupIdentity)
    assert isinstance(parse_cgroup_path(text), CgroupIdentity)


# Templates: (format, runtime, qos). {u} = dashed uid, {uu} = underscored uid, {c} = id.
TEMPLATES: list[tuple[str, str | None, str | None]] = [
    (
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uu}.slice"
        "/cri-containerd-{c}.scope",
        "containerd",
        "burstable",
    ),
    ("0::/kubepods.slice/kubepods-pod{uu}.slice/crio-{c}.scope", "cri-o", "guaranteed"),
    (
        "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uu}.slice"
        "/docker-{c}.scope",
        "docker",
        "besteffort",
    ),
    ("12:memory:/kubepods/burstable/pod{u}/{c}", None, "burstable"),
    ("4:pids:/kubepods/pod{u}/{c}", None, "guaranteed"),
    ("1:name=systemd:/kubepods/besteffort/pod{u}/crio-{c}", "cri-o", "besteffort"),
    (
        "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice"
        "/kubelet-kubepods-besteffort-pod{uu}.slice/cri-containerd-{c}.scope",
        "containerd",
        "besteffort",
    ),
    ("0::/kubelet/kubepods/burstable/pod{u}/{c}", None, "burstable"),
    ("0::/docker/{c}/kubepods/besteffort/pod{u}/{c}", None, "besteffort"),
    (
        "0::/../../kubepods-besteffort-pod{uu}.slice/cri-containerd-{c}.scope",
        "containerd",
        "besteffort",
    ),
]

_hex = "0123456789abcdef"
uids = st.uuids().map(str)
cids = st.text(alphabet=_hex, min_size=64, max_size=64)


@given(st.sampled_from(TEMPLATES), uids, cids, st.booleans())
def test_composed_ids_parse_back(
    template: tuple[str, str | None, str | None], uid: str, cid: str, upper: bool
) -> None:
    fmt, runtime, qos = template
    line = fmt.format(u=uid, uu=uid.replace("-", "_"), c=cid)
    if upper:
        line = line.replace(uid, uid.upper()).replace(cid, cid.upper())
        line = line.replace(uid.replace("-", "_"), uid.replace("-", "_").upper())
    assert parse_cgroup_file(line + "\n") == CgroupIdentity(uid, cid, runtime, qos)


@pytest.mark.parametrize(
    ("path", "unit"),
    [
        ("/system.slice/vllm-a.service", "vllm-a.service"),
        ("/system.slice/vllm@llama.service", "vllm@llama.service"),
        # A Delegate=yes service's own sub-cgroup is still that service's.
        ("/system.slice/vllm-a.service/payload", "vllm-a.service"),
        ("/user.slice/user-1000.slice/user@1000.service/app.slice/vllm.service", "vllm.service"),
        # The user's service manager holds every app of that user: no one workload.
        ("/user.slice/user-1000.slice/user@1000.service/app.slice/app-tmux-1.scope", None),
        ("/user.slice/user-1000.slice/session-3.scope", None),
        (f"/system.slice/docker-{'a' * 64}.scope", None),
        ("/system.slice/vllm-a.service (deleted)", "vllm-a.service"),
        ("/", None),
    ],
)
def test_systemd_unit(path: str, unit: str | None) -> None:
    assert systemd_unit(path) == unit
