"""Container-local CUDA ordinal -> host GPU UUID (identity rule 4)."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from gpuledger.identity.devices import (
    HostGpu,
    apply_cuda_visible_devices,
    container_device_map,
    cuda_enumeration_order,
    parse_nvidia_visible_devices,
    strip_replica_suffix,
)

# Four GPUs; uuids 0 and 1 share the prefix "GPU-8a3f" so that prefix is ambiguous.
G0 = HostGpu(0, "GPU-8a3f0c11-1111-4111-8111-111111111111", "00000000:18:00.0")
G1 = HostGpu(1, "GPU-8a3f9d22-2222-4222-8222-222222222222", "00000000:3B:00.0")
G2 = HostGpu(2, "GPU-c0ffee33-3333-4333-8333-333333333333", "00000000:86:00.0")
G3 = HostGpu(3, "GPU-deadbe44-4444-4444-8444-444444444444", "00000000:AF:00.0")
# GPU 4 is in MIG mode with two MIG devices.
G4 = HostGpu(4, "GPU-f00d0055-5555-4555-8555-555555555555", "00000000:D8:00.0")
M40 = HostGpu(4, "MIG-aaaa0000-0000-5000-8000-000000000000", G4.pci_bus_id, G4.uuid)
M41 = HostGpu(4, "MIG-bbbb1111-1111-5111-8111-111111111111", G4.pci_bus_id, G4.uuid)
HOST = (G0, G1, G2, G3, G4, M40, M41)
PLAIN = (G0, G1, G2, G3, G4)


# --- NVIDIA_VISIBLE_DEVICES (container toolkit) ---

NVD_CASES: list[tuple[str, str | None, tuple[HostGpu, ...]]] = [
    ("unset", None, ()),
    ("empty", "", ()),
    ("void", "void", ()),
    ("none: driver only", "none", ()),
    ("all: every non-MIG GPU", "all", PLAIN),
    ("indices", "0,2", (G0, G2)),
    ("indices given out of order come back in CUDA order", "2,0", (G0, G2)),
    ("whitespace", " 1 , 3 ", (G1, G3)),
    ("uuids", f"{G3.uuid},{G1.uuid}", (G1, G3)),
    ("uuid case-insensitive", G2.uuid.upper(), (G2,)),
    ("mig uuid", M41.uuid, (M41,)),
    ("mig index form", "4:1", (M41,)),
    ("mig index form, both", "4:1,4:0", (M40, M41)),
    ("mig index out of range skipped", "4:2,0", (G0,)),
    ("mig index of a GPU without MIG skipped", "0:0", ()),
    ("unknown entries skipped", "7,GPU-nope,1", (G1,)),
    ("duplicates removed", f"1,{G1.uuid},1", (G1,)),
    ("mixed", f"3,{G0.uuid},4:0", (G0, G3, M40)),
    ("volume-mounts strategy path is no device", "/var/run/nvidia-container-devices", ()),
]


@pytest.mark.parametrize(
    ("value", "expected"), [(v, e) for _, v, e in NVD_CASES], ids=[n for n, _, _ in NVD_CASES]
)
def test_parse_nvidia_visible_devices(value: str | None, expected: tuple[HostGpu, ...]) -> None:
    assert parse_nvidia_visible_devices(value, HOST) == expected


def test_mig_index_form_without_parent_entry_uses_mig_index() -> None:
    assert parse_nvidia_visible_devices("4:1", (G0, M40, M41)) == (M41,)


# --- CUDA enumeration order ---


def test_enumeration_sorts_by_pci_bus_id() -> None:
    shuffled = (G3, G0, G2, G1)
    assert cuda_enumeration_order(shuffled, "PCI_BUS_ID") == (G0, G1, G2, G3)
    assert cuda_enumeration_order(shuffled, None) == (G0, G1, G2, G3)
    assert cuda_enumeration_order(shuffled, "FASTEST_FIRST") == (G0, G1, G2, G3)


def test_enumeration_is_numeric_not_textual_and_mixes_domain_formats() -> None:
    a = HostGpu(0, "GPU-a", "0000:09:00.0")  # kernel-style 4-digit domain
    b = HostGpu(1, "GPU-b", "00000000:0A:00.0")  # NVML-style 8-digit domain
    c = HostGpu(2, "GPU-c", "00000001:01:00.0")
    assert cuda_enumeration_order((c, b, a), None) == (a, b, c)


def test_enumeration_keeps_mig_sibling_order_and_survives_bad_ids() -> None:
    odd = HostGpu(9, "GPU-odd", "not-a-bus-id")
    assert cuda_enumeration_order((odd, M41, M40), None) == (M41, M40, odd)


# --- CUDA_VISIBLE_DEVICES ---

VIS = (G0, G1, G2, G3)
CVD_CASES: list[tuple[str, str | None, tuple[HostGpu, ...]]] = [
    ("unset: all", None, VIS),
    ("empty: none", "", ()),
    ("blank: none", "  ", ()),
    ("indices", "0,2", (G0, G2)),
    ("reorder", "1,0", (G1, G0)),
    ("whitespace tolerated", " 3 ,\t1", (G3, G1)),
    ("leading zeros", "01", (G1,)),
    ("stop at out of range", "0,7,1", (G0,)),
    ("stop at negative", "0,2,-1,1", (G0, G2)),
    ("duplicate stops", "0,0", (G0,)),
    ("duplicate via uuid stops", f"2,{G2.uuid},1", (G2,)),
    ("full uuid", G3.uuid, (G3,)),
    ("uuid case-insensitive", G3.uuid.upper(), (G3,)),
    ("unique uuid prefix", "GPU-c0ff", (G2,)),
    ("unique prefix longer", "GPU-8a3f9", (G1,)),
    ("ambiguous prefix invalid", "GPU-8a3f,0", ()),
    ("ambiguous prefix stops later", "3,GPU-8a3f,0", (G3,)),
    ("unknown uuid stops", "1,GPU-ffffffff,0", (G1,)),
    ("garbage stops", "1,cuda:0,0", (G1,)),
    ("empty entry stops", "1,,0", (G1,)),
    ("trailing comma", "2,3,", (G2, G3)),
    ("bare hex without GPU- is invalid", "8a3f0c11", ()),
    ("plus sign invalid", "+1", ()),
    ("huge index invalid", "9" * 5000, ()),
    ("legacy MIG-GPU form invalid", f"MIG-{G0.uuid}/1/0", ()),
]


@pytest.mark.parametrize(
    ("value", "expected"), [(v, e) for _, v, e in CVD_CASES], ids=[n for n, _, _ in CVD_CASES]
)
def test_apply_cuda_visible_devices(value: str | None, expected: tuple[HostGpu, ...]) -> None:
    assert apply_cuda_visible_devices(value, VIS) == expected


def test_cuda_visible_devices_mig() -> None:
    visible = (M40, M41)
    assert apply_cuda_visible_devices(M41.uuid, visible) == (M41,)
    assert apply_cuda_visible_devices("MIG-bbbb", visible) == (M41,)
    assert apply_cuda_visible_devices("1,MIG-aaaa", visible) == (M41, M40)
    assert apply_cuda_visible_devices("MIG-", visible) == ()  # ambiguous
    assert apply_cuda_visible_devices("GPU-", (G0,)) == (G0,)  # unique, so valid


# --- replica suffix ---


@pytest.mark.parametrize(
    ("device_id", "expected"),
    [
        (f"{G0.uuid}::3", G0.uuid),
        (f"{G0.uuid}::0", G0.uuid),
        (G0.uuid, G0.uuid),
        (f" {G0.uuid}::12 ", G0.uuid),
        (f"{G0.uuid}::x", f"{G0.uuid}::x"),
        ("::3", "::3"),
        ("0::1", "0"),
        ("", ""),
    ],
)
def test_strip_replica_suffix(device_id: str, expected: str) -> None:
    assert strip_replica_suffix(device_id) == expected


# --- composition ---


def test_container_map_from_env() -> None:
    # Pod got host GPUs 1 and 3; the process hides the first: cuda:0 is host GPU 3.
    got = container_device_map("3,1", "1", None, HOST)
    assert got == (G3,)


def test_container_map_from_podresources_with_replicas_and_unknown() -> None:
    allocated = [f"{G2.uuid}::1", f"{G0.uuid}::4", "GPU-unknown::0", f"{G2.uuid}::2"]
    assert container_device_map("all", None, None, HOST, allocated) == (G0, G2)
    assert container_device_map("all", "1,0", None, HOST, allocated) == (G2, G0)


def test_container_map_podresources_index_strategy() -> None:
    assert container_device_map(None, None, None, HOST, ["3", "4:0"]) == (G3, M40)


def test_podresources_override_env_and_empty_falls_back() -> None:
    assert container_device_map("all", None, None, HOST, [G1.uuid]) == (G1,)
    assert container_device_map("0,2", None, None, HOST, []) == (G0, G2)
    assert container_device_map("0,2", None, None, HOST, None) == (G0, G2)


def test_container_map_no_gpus() -> None:
    assert container_device_map(None, None, None, HOST) == ()
    assert container_device_map("all", "", None, HOST) == ()


# --- property-based: the composition ---

_PCI_BUSES = st.lists(st.integers(0, 255), min_size=1, max_size=8, unique=True)


@st.composite
def hosts(draw: st.DrawFn) -> tuple[HostGpu, ...]:
    buses = draw(_PCI_BUSES)
    return tuple(
        HostGpu(i, f"GPU-{i:08x}-{bus:04x}-4000-8000-{i:012x}", f"00000000:{bus:02X}:00.0")
        for i, bus in enumerate(sorted(buses))
    )


@st.composite
def nvd_values(draw: st.DrawFn, host: tuple[HostGpu, ...]) -> str:
    kind = draw(st.sampled_from(["all", "list", "raw"]))
    if kind == "all":
        return "all"
    if kind == "raw":
        return draw(st.text(max_size=40))
    picks = draw(st.lists(st.sampled_from(host), min_size=1))
    return ",".join(str(g.index) if draw(st.booleans()) else g.uuid for g in picks)


@st.composite
def cvd_entries(draw: st.DrawFn, n: int) -> str:
    return draw(
        st.one_of(
            st.integers(-2, n + 2).map(str),
            st.text(max_size=12),
            st.sampled_from(["GPU-", "MIG-", "GPU-0000", " 0 ", ""]),
        )
    )


@st.composite
def scenario(draw: st.DrawFn) -> tuple[tuple[HostGpu, ...], str, str | None, str | None]:
    host = draw(hosts())
    nvd = draw(nvd_values(host))
    order = draw(st.sampled_from([None, "PCI_BUS_ID", "FASTEST_FIRST", "bogus"]))
    if draw(st.booleans()):
        cvd = None
    else:
        entries = draw(st.lists(cvd_entries(len(host)), max_size=6))
        cvd = ",".join(entries)
    return host, nvd, cvd, order


@given(scenario())
def test_prop_no_duplicates_and_subset(
    s: tuple[tuple[HostGpu, ...], str, str | None, str | None],
) -> None:
    host, nvd, cvd, order = s
    container = parse_nvidia_visible_devices(nvd, host)
    got = container_device_map(nvd, cvd, order, host)
    assert len({g.uuid for g in got}) == len(got)
    assert set(got) <= set(container)


@given(scenario())
def test_prop_unset_cvd_is_container_list(
    s: tuple[tuple[HostGpu, ...], str, str | None, str | None],
) -> None:
    host, nvd, _, order = s
    container = cuda_enumeration_order(parse_nvidia_visible_devices(nvd, host), order)
    assert container_device_map(nvd, None, order, host) == container


@given(scenario(), st.data())
def test_prop_permutation_of_indices(
    s: tuple[tuple[HostGpu, ...], str, str | None, str | None], data: st.DataObject
) -> None:
    host, nvd, _, order = s
    container = cuda_enumeration_order(parse_nvidia_visible_devices(nvd, host), order)
    perm = data.draw(st.permutations(range(len(container))))
    k = data.draw(st.integers(0, len(perm)))
    chosen = perm[:k]
    cvd = ",".join(str(i) for i in chosen)
    expected = tuple(container[i] for i in chosen)
    assert container_device_map(nvd, cvd, order, host) == expected


@given(scenario(), st.data())
def test_prop_uuid_permutation(
    s: tuple[tuple[HostGpu, ...], str, str | None, str | None], data: st.DataObject
) -> None:
    host, nvd, _, order = s
    container = cuda_enumeration_order(parse_nvidia_visible_devices(nvd, host), order)
    assume(container)
    perm = data.draw(st.permutations(container))
    cvd = ",".join(g.uuid for g in perm)
    assert container_device_map(nvd, cvd, order, host) == tuple(perm)


@given(
    scenario(),
    st.sampled_from(["garbage", "-1", "99", "GPU-zzzz", "", "MIG-", "1.5", "cuda:0"]),
    st.text(max_size=20),
)
def test_prop_appending_garbage_never_changes_result(
    s: tuple[tuple[HostGpu, ...], str, str | None, str | None], bad: str, tail: str
) -> None:
    host, nvd, cvd, order = s
    assume(cvd is not None)
    before = container_device_map(nvd, cvd, order, host)
    # Appending an invalid entry (and anything after it) must not change the result,
    # unless parsing had already stopped, in which case it cannot change either.
    after = container_device_map(nvd, f"{cvd},{bad},{tail}", order, host)
    assert after == before


@given(st.text(), st.text(), st.one_of(st.none(), st.text()), hosts(), st.lists(st.text()))
def test_prop_no_input_raises(
    nvd: str, cvd: str, order: str | None, host: tuple[HostGpu, ...], allocated: list[str]
) -> None:
    container_device_map(nvd, cvd, order, host, allocated)
    container_device_map(nvd, cvd, order, host, None)
    apply_cuda_visible_devices(cvd, host)
    parse_nvidia_visible_devices(nvd, host)
    strip_replica_suffix(cvd)


@given(st.text(), st.text(), st.text())
def test_prop_no_input_raises_on_odd_host_entries(uuid: str, bus: str, value: str) -> None:
    host = (HostGpu(0, uuid, bus), HostGpu(1, uuid, bus, uuid))
    container_device_map(value, value, value, host, [value])
    cuda_enumeration_order(host, value)
