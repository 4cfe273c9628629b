"""The eager hot path's pieces on a real GPU, in one process: LaunchSequence
replays with patched call numbers and output addresses, stream-ordered
allocation that never waits for the device, and a Communicator of one rank
replaying its calls.  Replays at 2-8 ranks run in every scenario of
tests/mpi (each repeats its calls' signatures)."""
import gc
import struct

import numpy as np
import pytest

import pyar
import pyar._hip as hip

pytestmark = pytest.mark.gpu

RECORD = struct.Struct("<QqQiIfI")  # pyar_test_store_args' record (test_runtime_gpu.py)
STORE_ARGTYPES = ("ptr", "ptr", "int32", "int64", "uint32", "uint64", "float32")
SPIN_US = 300_000  # long enough that nothing queued behind it can have run yet


def records(ptr, count):
    raw = np.empty(count * RECORD.size, np.uint8)
    hip.memcpy_dtoh(raw, ptr)
    return [RECORD.unpack_from(raw.tobytes(), k * RECORD.size) for k in range(count)]


def test_launch_sequence_patches_call_numbers_and_the_output(kernels):
    function = kernels.module.get_function("pyar_test_store_args", STORE_ARGTYPES)
    source = hip.DeviceMemory(RECORD.size)
    hip.memset(source.ptr, 0xAB, RECORD.size)
    sequence = hip.LaunchSequence()
    for k in range(2):  # record k at out + k * RECORD.size, its u32 the call number
        sequence.add_kernel(function, 1, 1, (0, 0xC0FFEE + k, -k, -(2**40), 0, 2**63 + k, 1.5),
                            call_arg=4, out_args={0: k * RECORD.size})
    sequence.add_copy(0, source.ptr, RECORD.size, out_offset=2 * RECORD.size)
    assert len(sequence) == 3 and sequence.calls == 2
    stream = hip.Stream()
    outs = [hip.DeviceMemory(3 * RECORD.size) for _ in range(2)]
    for first, out in zip((41, 0xFFFFFFFF), outs):
        sequence.run(stream.handle, first, out.ptr)
    stream.synchronize()
    for first, out in zip((41, 0xFFFFFFFF), outs):
        got = records(out.ptr, 3)
        for k in range(2):
            assert got[k] == (0xC0FFEE + k, -(2**40), 2**63 + k, -k, (first + k) & 0xFFFFFFFF,
                              1.5, 0xFEEDBEEF), (first, k, got[k])
        raw = np.empty(RECORD.size, np.uint8)
        hip.memcpy_dtoh(raw, out.ptr + 2 * RECORD.size)
        assert (raw == 0xAB).all()


def test_empty_comes_from_the_pool_and_frees_without_waiting(kernels, rng):
    stream = hip.Stream()
    a = pyar.empty((1 << 20,), np.float32, stream=stream)
    assert a.stream_ordered and isinstance(a._owner, hip.PoolMemory)
    assert not pyar.empty((16,), np.float32, ipc=True).stream_ordered
    host = rng.standard_normal(a.size).astype(np.float32)
    a.set(host)
    assert np.array_equal(a.get(), host)
    kernels.spin(SPIN_US, stream)
    del a
    gc.collect()
    for _ in range(100):  # allocate and drop again, all queued behind the spin
        pyar.zeros((1 << 16,), np.float32, stream=stream)
    assert not stream.query(), "freeing pool memory waited for the stream"
    stream.synchronize()


class CountedSequence(hip.LaunchSequence):
    """A LaunchSequence that keeps count of the plans compiled and their replays."""
    made = []

    def __init__(self):
        self.replays = 0
        CountedSequence.made.append(self)

    def run(self, stream, first_call=0, out=0):
        self.replays += 1
        return super().run(stream, first_call, out)


def test_communicator_of_one_rank_replays_without_waiting(kernels, rng, monkeypatch):
    from mpi4py import MPI
    from pyar.comm import _eager
    # The communicator compiles its plans into CountedSequence.
    monkeypatch.setattr(_eager, "LaunchSequence", CountedSequence)
    CountedSequence.made.clear()
    stream = hip.Stream()
    with pyar.Communicator(MPI.COMM_WORLD) as comm:
        if comm.world != 1:
            pytest.skip("this process is one of several MPI ranks")
        host = rng.standard_normal(4096).astype(np.float32)
        x = pyar.asarray(host, stream=stream)
        out = pyar.empty_like(x)
        with pytest.raises(ValueError, match="stream-ordered pool"):
            comm.register(x)
        comm.register(pyar.empty((16,), np.float32, ipc=True))  # nothing to exchange
        kernels.spin(SPIN_US, stream)
        for _ in range(200):
            y = comm.allreduce(x, stream=stream)
            comm.allreduce(x, out=out, stream=stream)
        assert not stream.query(), "an eager call with out=None waited for the device"
        # One plan per signature, replayed since.
        assert [plan.replays for plan in CountedSequence.made] == [199, 199]
        assert y.stream_ordered and y.stream is stream
        assert np.array_equal(y.get(), host) and np.array_equal(out.get(), host)
