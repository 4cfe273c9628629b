"""The runtime layer on a real GPU: devices (identity, attributes, ordinals,
versions) and the memory information they report.

Every test draws its own random data (seeded by the test id and
$PYAR_TEST_SEED, printed on failure) so that no two tests check the same bytes.
Marked ``gpu``: where no GPU is visible they skip (tests/conftest.py), except
under PYAR_REQUIRE_GPU=1, where that is a failure.
"""
import operator
import os
import re

import pytest

import pyar._hip as hip

pytestmark = pytest.mark.gpu


def test_device_identity():
    count = hip.get_device_count()
    assert count >= 1
    platform = hip.platform()
    assert platform in ("cuda", "hip")
    assert os.path.basename(hip.library_path())
    current = hip.get_device()
    assert 0 <= current < count
    assert hip.Device().ordinal == current
    for ordinal in range(count):
        device = hip.Device(ordinal)
        assert device.name.strip(), f"device {ordinal} has an empty name"
        arch = device.arch
        if platform == "cuda":
            assert re.fullmatch(r"sm_\d{2,3}[a-z]?", arch), arch
            major, minor = device.compute_capability
            assert arch.startswith(f"sm_{major}{minor}"), (arch, major, minor)
            assert device.warp_size == 32
        else:
            assert re.fullmatch(r"gfx[0-9a-f]{3,4}", arch.split(":")[0]), arch
            assert device.warp_size in (32, 64)
        assert device.multiprocessor_count > 0
        assert device.max_threads_per_block >= 256
        assert device.max_shared_memory_per_block >= 16 * 1024
        assert device.l2_cache_size > 0
        assert re.fullmatch(r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]",
                            device.pci_bus_id), device.pci_bus_id
        free, total = device.memory_info()
        assert 0 < free <= total, (free, total)
        assert total >= 1 << 30
        assert repr(device).startswith(f"<pyar.Device {ordinal}:")
        assert operator.index(device) == ordinal
    bus_ids = {hip.Device(i).pci_bus_id for i in range(count)}
    assert len(bus_ids) == count, "two devices report the same PCI bus id"
    hip.set_device(current)
    assert hip.get_device() == current


def test_device_ordinal_validation():
    count = hip.get_device_count()
    with pytest.raises(ValueError, match="out of range"):
        hip.Device(count)
    with pytest.raises(ValueError):
        hip.set_device(-1)
    with pytest.raises(TypeError):
        hip.Device("0")
    assert hip.driver_version() > 0
    assert hip.runtime_version() > 0


def test_memory_info_sees_an_allocation(rng):
    device = hip.Device()
    nbytes = int(rng.integers(512, 1024)) << 20  # 0.5-1 GiB: far above allocator noise
    free_before, total = device.memory_info()
    with hip.DeviceMemory(nbytes) as mem:
        free_during, total_during = device.memory_info()
        assert total_during == total
        assert mem.ptr != 0 and mem.size == nbytes and not mem.closed
        # Other processes may allocate meanwhile; only a drop of at least most of
        # the allocation is checked.
        assert free_before - free_during >= nbytes // 2, (free_before, free_during, nbytes)
    assert mem.closed and mem.ptr == 0
