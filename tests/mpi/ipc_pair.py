"""IPC between two MPI processes on one GPU (run by tests/gpu/test_ipc_gpu.py
through tests/mpi_launch.run_scenario("ipc_pair", 2)).

Rank 0 allocates device memory and exports a pointer that is NOT the
allocation's base (base + offset); the pickled IpcHandle travels through
mpi4py.  Rank 1 maps it, checks the bytes rank 0 placed there, writes its own
bytes into another region through the mapping, and later reads what rank 0
wrote after the mapping was opened (a live mapping, not a snapshot).  Rank 0
checks the whole allocation byte by byte (rank 1 wrote where asked and
nowhere else).  The mapping is closed before rank 0 frees the memory.

Usage: ipc_pair.py [seed]
"""
import os
import pickle
import sys
import time
import traceback

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import pyar._hip as hip  # noqa: E402
from tests.mpi_launch import report  # noqa: E402

comm = MPI.COMM_WORLD
rank = comm.Get_rank()


def layout(seed):
    """Everything both ranks must agree on, derived from the shared seed."""
    rng = np.random.default_rng(seed)
    total = int(rng.integers(4 << 20, 8 << 20)) + int(rng.integers(1, 256))
    offset = 256 * int(rng.integers(1, 4096)) + 16 * int(rng.integers(1, 16))  # not the base
    size_a = int(rng.integers(100_000, 1 << 20)) + 3  # read by rank 1
    gap = int(rng.integers(1, 4096))
    size_b = int(rng.integers(100_000, 1 << 20)) + 5  # written by rank 1
    offset_b = size_a + gap  # relative to the exported pointer
    assert offset + offset_b + size_b < total
    image = rng.integers(0, 256, total, dtype=np.uint8)  # rank 0's initial contents
    data_b = rng.integers(0, 256, size_b, dtype=np.uint8)
    data_c = rng.integers(0, 256, size_a, dtype=np.uint8)  # rank 0's second write
    return dict(total=total, offset=offset, size_a=size_a, offset_b=offset_b, size_b=size_b,
                image=image, data_b=data_b, data_c=data_c)


def first_difference(actual, expected):
    bad = np.flatnonzero(actual != expected)
    return None if bad.size == 0 else (int(bad.size), int(bad[0]))


def rank0(plan, failures):
    total, offset = plan["total"], plan["offset"]
    memory = hip.DeviceMemory(total)
    hip.memcpy_htod(memory.ptr, plan["image"])
    exported = memory.ptr + offset
    handle = hip.ipc_get_handle(exported)
    if handle.offset != offset:
        failures.append(f"rank 0: handle offset {handle.offset}, exported at base + {offset}")
    base, size = hip.address_range(exported)
    if base != memory.ptr or handle.size != size or size < total:
        failures.append(f"rank 0: address range ({base:#x}, {size}) / handle size "
                        f"{handle.size} for an allocation of {total} at {memory.ptr:#x}")
    comm.send(pickle.dumps(handle), dest=1, tag=1)
    comm.Barrier()  # 1: rank 1 has read region A and written region B

    expected = plan["image"].copy()
    start_b = offset + plan["offset_b"]
    expected[start_b:start_b + plan["size_b"]] = plan["data_b"]
    got = np.empty(total, np.uint8)
    hip.memcpy_dtoh(got, memory.ptr)
    diff = first_difference(got, expected)
    if diff is not None:
        failures.append(f"rank 0: after rank 1's write {diff[0]} bytes differ from the "
                        f"expected image, first at allocation byte {diff[1]} (region B is "
                        f"[{start_b}, {start_b + plan['size_b']}))")
    # A second write after the peer mapped the memory: the peer must see it.
    hip.memcpy_htod(exported, plan["data_c"])
    hip.device_synchronize()
    comm.Barrier()  # 2: region A holds data_c
    comm.Barrier()  # 3: rank 1 has checked data_c and closed its mapping
    memory.free()
    return dict(exported_offset=offset, allocation=total)


def rank1(plan, failures):
    handle = pickle.loads(comm.recv(source=0, tag=1))
    if not isinstance(handle, hip.IpcHandle) or handle.offset != plan["offset"]:
        failures.append(f"rank 1: received {handle!r}, expected offset {plan['offset']}")
    mapping = hip.ipc_open(handle)
    try:
        if mapping.ptr != mapping.base + plan["offset"]:
            failures.append(f"rank 1: mapping.ptr {mapping.ptr:#x} != base {mapping.base:#x} "
                            f"+ offset {plan['offset']}")
        if hip.pointer_device(mapping.ptr) != hip.get_device():
            failures.append("rank 1: the mapping is not on this rank's device")
        base, size = hip.address_range(mapping.ptr)
        if base != mapping.base or size < plan["total"]:
            failures.append(f"rank 1: mapped range ({base:#x}, {size}), mapping base "
                            f"{mapping.base:#x}, allocation {plan['total']}")
        start = plan["offset"]
        region_a = np.empty(plan["size_a"], np.uint8)
        hip.memcpy_dtoh(region_a, mapping.ptr)
        diff = first_difference(region_a, plan["image"][start:start + plan["size_a"]])
        if diff is not None:
            failures.append(f"rank 1: region A: {diff[0]} of {plan['size_a']} bytes differ, "
                            f"first at {diff[1]} (the offset was not applied?)")
        # The bytes just before the exported pointer, through the mapping's base.
        head = np.empty(min(start, 4096), np.uint8)
        hip.memcpy_dtoh(head, mapping.ptr - head.size)
        diff = first_difference(head, plan["image"][start - head.size:start])
        if diff is not None:
            failures.append(f"rank 1: the {head.size} bytes before the exported pointer differ")
        hip.memcpy_htod(mapping.ptr + plan["offset_b"], plan["data_b"])
        hip.device_synchronize()
        comm.Barrier()  # 1
        comm.Barrier()  # 2
        again = np.empty(plan["size_a"], np.uint8)
        hip.memcpy_dtoh(again, mapping.ptr)
        diff = first_difference(again, plan["data_c"])
        if diff is not None:
            failures.append(f"rank 1: rank 0's later write is not visible: {diff[0]} of "
                            f"{plan['size_a']} bytes differ")
    finally:
        mapping.close()
    if not mapping.closed:
        failures.append("rank 1: mapping not closed")
    mapping.close()  # twice is fine
    comm.Barrier()  # 3
    return dict(exported_offset=plan["offset"], allocation=plan["total"])


def main():
    if comm.Get_size() != 2:
        raise SystemExit(f"ipc_pair needs exactly 2 ranks, got {comm.Get_size()}")
    hip.set_device(0)  # both ranks on GPU 0: IPC within one device across processes
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else None
    if rank == 0 and seed is None:
        seed = int(np.random.SeedSequence().entropy % 2**32)
    seed = comm.bcast(seed, root=0)
    plan = layout(seed)
    failures = []
    start = time.perf_counter()
    fields = (rank0 if rank == 0 else rank1)(plan, failures)
    elapsed = time.perf_counter() - start
    all_failures = [f for fs in comm.allgather(failures) for f in fs]
    report(test="ipc", rank=rank, seed=seed, ok=not all_failures, failures=failures,
           bytes_read=plan["size_a"], bytes_written=plan["size_b"],
           seconds=round(elapsed, 3), platform=hip.platform(), **fields)
    comm.Barrier()
    if all_failures:
        if rank == 0:
            print("\n".join(all_failures), file=sys.stderr, flush=True)
        sys.exit(1)


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except BaseException:
        # Do not leave the peer waiting at a barrier forever.
        traceback.print_exc()
        sys.stderr.flush()
        comm.Abort(1)
