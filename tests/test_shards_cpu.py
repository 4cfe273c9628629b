"""reduce_scatter and all_gather without a GPU (tier a): the shard rule
(pyar/comm/shards.py), argument errors, and the host's plan of copies and
launches checked end to end against a host model of the kernels.

The model runs the kernels as pyar/comm/shards.py and docs/api.md specify
them (which elements each launch reads through the input table, where it writes), on
one byte array standing for every rank's memory: W NodeCommunicators
assembled over the stand-ins of tests/comm_stand_ins.py (each rank's scratch
and state in its part of the array), staging copies recorded through a
monkeypatched ``memcpy_dtod``, kernels recorded by stand-in functions, plans
compiled into a recording sequence.  The ranks' steps then run in lockstep,
as the barriers order them: every rank's copies before a launch, then every
rank's launch.  So a wrong offset, stride, chunk or staging copy on the host
shows as a wrong sum here, before any GPU runs it.
"""
import os
import re
import sys
import types

import ml_dtypes
import numpy as np
import pytest

pytest.importorskip("mpi4py")

import pyar  # noqa: E402
from pyar import _hip  # noqa: E402
from pyar.comm import arguments, kernels, layout, shards  # noqa: E402
from pyar.comm.errors import CollectiveTimeout  # noqa: E402
from tests.comm_stand_ins import (  # noqa: E402
    RecordingModule, RegistryStandIn, assemble, error_record,
)
from tests.comm_stand_ins import sequences  # noqa: E402,F401 - a fixture
from tests.mpi_launch import ROOT  # noqa: E402

F32, F16, BF16 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)
DTYPES = (F32, F16, BF16)


# --- the shard rule -----------------------------------------------------------------

@pytest.mark.parametrize("world", range(1, 9))
@pytest.mark.parametrize("itemsize", [2, 4])
@pytest.mark.parametrize("n", [0, 1, 2, 7, 8, 9, 31, 64, 1000, 1003, (1 << 20) + 3])
def test_shards_partition_the_array_in_rank_order(world, itemsize, n):
    lanes = 16 // itemsize
    shard = shards.shard_size(n, world, itemsize)
    assert shard == lanes * -(-n // (lanes * world))
    assert shard % lanes == 0 and shard * world >= n
    spans = [shards.bounds(n, world, itemsize, r) for r in range(world)]
    assert spans[0][0] == 0 and spans[-1][1] == n
    for (start, end), (next_start, _) in zip(spans, spans[1:]):
        assert end == next_start  # contiguous, rank order
    lengths = [shards.length(n, world, itemsize, r) for r in range(world)]
    assert sum(lengths) == n
    for r, (start, end) in enumerate(spans):
        assert start % lanes == 0 or start == n  # every shard starts on a pack
        assert lengths[r] == end - start <= shard
    # Only the last non-empty shard may be short; empty ones come after it.
    full = [length == shard for length in lengths]
    nonempty = [length > 0 for length in lengths]
    assert nonempty == sorted(nonempty, reverse=True)
    assert all(full[:max(0, sum(nonempty) - 1)])


def test_shard_rule_examples():
    assert [shards.length(1, 4, 4, r) for r in range(4)] == [1, 0, 0, 0]
    assert [shards.length(20, 2, 4, r) for r in range(2)] == [12, 8]  # shard 12
    assert [shards.bounds(20, 3, 2, r) for r in range(3)] == [(0, 8), (8, 16), (16, 20)]
    assert [shards.length(4097, 8, 2, r) for r in range(8)] == [520] * 7 + [457]


@pytest.mark.parametrize("world", [2, 3, 8])
@pytest.mark.parametrize("itemsize", [2, 4])
@pytest.mark.parametrize("n", [1, 9, 1003, 100_003])
@pytest.mark.parametrize("most", [8, 64, 1 << 20])
def test_chunks_cover_every_shard_once(world, itemsize, n, most):
    lanes = 16 // itemsize
    shard = shards.shard_size(n, world, itemsize)
    runs = shards.chunks(n, world, itemsize, most)
    assert runs[0][0] == 0 and sum(count for _, count in runs) == shard
    for (first, count), (following, _) in zip(runs, runs[1:]):
        assert first + count == following
    for first, count in runs:
        assert first % lanes == 0 and count % lanes == 0 and 0 < count <= max(most, lanes)
    for q in range(world):
        covered = sum(shards.run_length(n, world, itemsize, q, first, count)
                      for first, count in runs)
        assert covered == shards.length(n, world, itemsize, q)


def test_chunk_elements_needs_a_whole_pack():
    assert shards.chunk_elements(1000, 4) == 1000
    assert shards.chunk_elements(1001, 2) == 1000
    with pytest.raises(ValueError, match="less than one 16-byte pack: raise max_size"):
        shards.chunk_elements(7, 2)


# --- ranks made without a GPU ---------------------------------------------------------

BASE = 0x10_0000_0000          # the model's memory starts here
REGION = 1 << 20               # per rank: x, out, scratch, registered copy of x
X_AT, OUT_AT, SCRATCH_AT, STATE_AT = 0, 1 << 18, 2 << 18, 3 << 18
STAGED_TABLE, REGISTERED_TABLE = 0x20_0000_0000, 0x30_0000_0000


class Kernel:
    """A recording stand-in for one reduce_scatter/all_gather kernel: its
    launches go to its rank's ``events``."""

    def __init__(self, operation, dtype, out_dtype, events):
        self.operation, self.dtype, self.out_dtype = operation, dtype, out_dtype
        self.argtypes = kernels.SHARD_ARGS
        self.events = events

    def launch(self, grid, block, args=(), shared_mem=0, stream=None):
        assert len(args) == len(self.argtypes)
        self.events.append(("kernel", self, grid, block, tuple(args)))


class RankKernels:
    """The shard kernels of one rank (a kernels.KernelSet stand-in)."""

    def __init__(self, events):
        self.events = events

    def shard(self, operation, dtype, out_dtype):
        return Kernel(operation, dtype, out_dtype, self.events)


class Rank:
    """One rank of the model: its communicator (``comm``), the copies and
    launches it queued in order (``events``), where its memory starts
    (``region``), its buffer registry's tables ((address, nbytes) -> table)
    and its error record (``words``)."""

    def __init__(self, world, rank, max_size):
        self.region = BASE + rank * REGION
        self.state = self.region + STATE_AT
        self.events = []
        registry = RegistryStandIn()
        self.registered = registry.tables
        self.words = error_record()
        self.comm = assemble(world, rank, max_size, kernels_=RankKernels(self.events),
                             registry=registry, words=self.words, shard_blocks=3,
                             scratch=self.region + SCRATCH_AT, state=self.state,
                             staged_table=STAGED_TABLE)


class Model:
    """W ranks over one byte array; ``run`` executes their recorded steps in lockstep."""

    def __init__(self, world, max_size, monkeypatch):
        self.world = world
        self.memory = np.zeros(world * REGION, np.uint8)
        self.ranks = [Rank(world, r, max_size) for r in range(world)]
        self.current = None
        monkeypatch.setattr(_hip, "memcpy_dtod", self._record_copy)
        self.tables = {STAGED_TABLE: [rank.region + SCRATCH_AT for rank in self.ranks]}

    def _record_copy(self, dst, src, nbytes, stream=None):
        self.current.events.append(("copy", dst, src, nbytes))

    def view(self, address, count, dtype):
        start = address - BASE
        return self.memory[start:start + count * dtype.itemsize].view(dtype)

    def array(self, rank, at, values):
        self.view(self.ranks[rank].region + at, values.size, values.dtype)[:] = values
        return pyar.DeviceArray.from_pointer(self.ranks[rank].region + at, values.shape,
                                             values.dtype, device=0)

    def empty(self, rank, at, count, dtype, fill):
        self.view(self.ranks[rank].region + at, count, dtype)[:] = fill
        return pyar.DeviceArray.from_pointer(self.ranks[rank].region + at, (count,), dtype,
                                             device=0)

    def register(self, arrays):
        """Every rank's array in one input table, as register() leaves it."""
        table = REGISTERED_TABLE + len(self.tables) * 64
        self.tables[table] = [a.ptr for a in arrays]
        for rank, a in zip(self.ranks, arrays):
            rank.registered[(a.ptr, a.nbytes)] = table

    def call(self, method, per_rank):
        """``method(*per_rank[r])`` of every rank's communicator, recording its steps."""
        results = []
        for rank, args in zip(self.ranks, per_rank):
            self.current = rank
            results.append(getattr(rank.comm, method)(*args))
        self.current = None
        return results

    def run(self):
        """Every rank's recorded steps, a launch at a time across ranks."""
        segments = []
        for rank in self.ranks:
            steps, segment = [], []
            for event in rank.events:
                segment.append(event)
                if event[0] == "kernel":
                    steps.append(segment)
                    segment = []
            assert segment == [], "a copy after the last launch"
            segments.append(steps)
            rank.events.clear()
        counts = {len(s) for s in segments}
        assert len(counts) == 1, f"ranks launch different numbers of kernels: {counts}"
        launches = counts.pop()
        for i in range(launches):
            kernels = [s[i][-1] for s in segments]
            # Every rank launches the same grid with the same signature.
            assert len({(k[1].operation, k[2], k[3], k[4][5:11]) for k in kernels}) == 1, \
                kernels
            for s in segments:
                for _, dst, src, nbytes in s[i][:-1]:
                    self.memory[dst - BASE:dst - BASE + nbytes] = \
                        self.memory[src - BASE:src - BASE + nbytes]
            for rank, (_, kernel, _, _, args) in enumerate(kernels):
                getattr(self, kernel.operation)(rank, kernel, *args)
        return launches

    def reduce_scatter(self, rank, kernel, table, in_offset, in_stride, out, state, n, shard,
                       first, count, timeout_ns, signature, call):
        assert state == self.ranks[rank].state
        length = max(0, min(min(n, (rank + 1) * shard) - (rank * shard + first), count))
        total = np.zeros(length, np.float32)
        for pointer in self.tables[table]:  # rank order, in float32
            total += self.view(pointer + (in_offset + rank * in_stride) * kernel.dtype.itemsize,
                               length, kernel.dtype).astype(np.float32)
        self.view(out, length, kernel.out_dtype)[:] = total.astype(kernel.out_dtype)

    def all_gather(self, rank, kernel, table, in_offset, in_stride, out, state, n, shard,
                   first, count, timeout_ns, signature, call):
        assert state == self.ranks[rank].state
        itemsize = kernel.dtype.itemsize
        for q, pointer in enumerate(self.tables[table]):
            length = max(0, min(min(n, (q + 1) * shard) - (q * shard + first), count))
            self.view(out + (q * shard + first) * itemsize, length, kernel.dtype)[:] = \
                self.view(pointer + in_offset * itemsize, length, kernel.dtype)


@pytest.fixture
def make_model(monkeypatch, sequences):
    """``make_model(world, max_size)``: a Model whose ranks compile their plans
    into recording sequences (``sequences``)."""
    return lambda world, max_size: Model(world, max_size, monkeypatch)


def _inputs(world, n, dtype, seed):
    rng = np.random.default_rng(seed)
    return [rng.integers(-8, 9, size=n).astype(dtype) for _ in range(world)]


COUNTS = [1, 7, 37, 1003]


@pytest.mark.parametrize("world", [2, 3, 4, 8])
@pytest.mark.parametrize("dtype,out_dtype", [(F32, F32), (F16, F16), (F16, F32),
                                             (BF16, BF16), (BF16, F32)])
@pytest.mark.parametrize("registered", [False, True], ids=["staged", "registered"])
@pytest.mark.parametrize("max_size", [256, 1 << 16], ids=["chunked", "whole"])
def test_reduce_scatter_plan_sums_each_shard(make_model, world, dtype, out_dtype, registered,
                                             max_size):
    """Integer-valued inputs: every shard's sum is exact in every dtype."""
    for n in COUNTS:
        model = make_model(world, max_size)
        inputs = _inputs(world, n, dtype, (world, n))
        xs = [model.array(r, X_AT, inputs[r]) for r in range(world)]
        if registered:
            model.register(xs)
        outs = [model.empty(r, OUT_AT, shards.length(n, world, dtype.itemsize, r), out_dtype,
                            0xFF) for r in range(world)]
        got = model.call("reduce_scatter", [(x, out) for x, out in zip(xs, outs)])
        assert [g is o for g, o in zip(got, outs)] == [True] * world
        launches = model.run()
        want = np.sum([i.astype(np.float64) for i in inputs], axis=0).astype(out_dtype)
        for r in range(world):
            start, end = shards.bounds(n, world, dtype.itemsize, r)
            result = model.view(outs[r].ptr, end - start, out_dtype)
            assert np.array_equal(result, want[start:end]), (n, r)
        each = shards.chunk_elements(max_size // dtype.itemsize // world, dtype.itemsize)
        assert launches == len(shards.chunks(n, world, dtype.itemsize, each))


@pytest.mark.parametrize("world", [2, 3, 4, 8])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("registered", [False, True], ids=["staged", "registered"])
@pytest.mark.parametrize("max_size", [256, 1 << 16], ids=["chunked", "whole"])
def test_all_gather_plan_concatenates_the_shards(make_model, world, dtype, registered,
                                                 max_size):
    for n in COUNTS + [world * 64]:  # the last: shards of one length, read in place
        model = make_model(world, max_size)
        whole = _inputs(1, n, dtype, (world, n, 1))[0]
        xs = []
        for r in range(world):
            start, end = shards.bounds(n, world, dtype.itemsize, r)
            xs.append(model.array(r, X_AT, whole[start:end]))
        if registered:
            model.register(xs)
        outs = [model.empty(r, OUT_AT, n, dtype, 0xFF) for r in range(world)]
        model.call("all_gather", [(x, out) for x, out in zip(xs, outs)])
        model.run()
        for r in range(world):
            assert np.array_equal(model.view(outs[r].ptr, n, dtype), whole), (n, r)


def test_reduce_scatter_launch_arguments(make_model):
    """Parameters by the kernel's names: staged and chunked, 3 ranks, float16 to float32."""
    world, n, max_size = 3, 1003, 256
    model = make_model(world, max_size)
    rank = model.current = model.ranks[1]
    x = model.array(1, X_AT, np.ones(n, F16))
    out = model.empty(1, OUT_AT, shards.length(n, world, 2, 1), F32, 0)
    rank.comm.reduce_scatter(x, out)
    names = ["in", "in_offset", "in_stride", "out", "state", "n", "shard", "first", "count",
             "timeout_ns", "signature", "call"]
    launches = [e for e in rank.events if e[0] == "kernel"]
    shard = shards.shard_size(n, world, 2)  # 336
    each = 40  # 256 bytes / 2 bytes / 3 ranks = 42 elements, whole packs of 8
    assert len(launches) == -(-shard // each)
    for number, (_, kernel, grid, block, args) in enumerate(launches):
        got = dict(zip(names, args))
        first = number * each
        assert got["first"] == first and got["count"] == min(each, shard - first)
        assert (got["n"], got["shard"], got["call"]) == (n, shard, number)
        assert (got["in"], got["in_offset"], got["in_stride"]) == (STAGED_TABLE, 0, got["count"])
        assert got["out"] == out.ptr + first * 4
        assert got["signature"] == layout.signature("reduce_scatter", n, F16, False, 1)
        assert (grid, block) == (1, 512)
        assert (kernel.operation, kernel.dtype, kernel.out_dtype) == ("reduce_scatter", F16, F32)
    # A timeout the kernels record for call 0 names the call as the log describes it.
    rank.words[kernels.FAILED], rank.words[kernels.CALL], rank.words[kernels.MISSING] = 1, 0, 1
    with pytest.raises(CollectiveTimeout) as raised:
        rank.comm.reduce_scatter(x, out)
    assert raised.value.call.startswith("reduce_scatter call 0 (1003 x float16 to float32")


def test_a_repeated_call_replays_its_plan(make_model, sequences):
    """The second reduce_scatter/all_gather with the same arrays is not checked
    again: its plan (signature included) is queued as it was compiled."""
    world, n = 2, 1003
    model = make_model(world, 256)
    rank = model.current = model.ranks[0]
    comm = rank.comm
    x = model.array(0, X_AT, np.ones(n, BF16))
    out = model.empty(0, OUT_AT, shards.length(n, world, 2, 0), F32, 0)
    for _ in range(3):
        assert comm.reduce_scatter(x, out) is out
    launches = [e for e in rank.events if e[0] == "kernel"]  # the checked call's only
    (plan,) = sequences  # the reduce_scatter's
    # Each replay numbers as many calls as the checked call launched kernels.
    assert plan.runs == [(0, len(launches), 0), (0, 2 * len(launches), 0)]
    planned = [step for step in plan.steps if step[0] == "kernel"]
    assert [step[4][:-1] for step in planned] == [k[4][:-1] for k in launches]
    gathered = model.empty(0, OUT_AT + 4096, n, BF16, 0)
    shard = pyar.DeviceArray.from_pointer(x.ptr, (shards.length(n, world, 2, 0),), BF16,
                                          device=0)
    comm.all_gather(shard, gathered)
    comm.all_gather(shard, n=None, out=gathered)
    assert len(sequences) == 2  # one plan for both all_gather calls
    assert len(sequences[1].runs) == 1


class FakeTorchTensor:
    """What pyar's probe and current-stream reader read of a PyTorch tensor."""
    __module__ = "torch"

    def __init__(self, ptr, count, dtype, device):
        self.ptr, self.shape, self.dtype, self.device = ptr, (count,), dtype, device

    def data_ptr(self):
        return self.ptr

    def stride(self):
        return (1,)


def test_a_replay_asks_the_current_stream_of_each_device(monkeypatch, make_model):
    """An empty shard may live on another device than the communicator's.  A
    replayed all_gather asks PyTorch's current stream of every device its
    tensors are on: once the output's device has another current stream, the
    call goes to the checks (which order that stream's work before the kernel)."""
    streams = {0: 0, 1: 0}
    torch = types.SimpleNamespace(cuda=types.SimpleNamespace(
        current_stream=lambda device: types.SimpleNamespace(cuda_stream=streams[device])))
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setattr(arguments, "asarray", lambda t, stream=None: pyar.DeviceArray.from_pointer(
        t.ptr, t.shape, t.dtype, owner=t, device=t.device))
    model = make_model(4, 1 << 16)
    rank = model.current = model.ranks[3]
    n = 8  # one float16 pack, all on rank 0: rank 3's shard is empty
    x = FakeTorchTensor(rank.region + X_AT, 0, F16, device=1)
    out = FakeTorchTensor(rank.region + OUT_AT, n, F16, device=0)
    for _ in range(3):  # checked, replayed by its key, replayed as the last call
        rank.comm.all_gather(x, out)
    checked = len(rank.events)
    rank.comm.all_gather(x, out)
    assert len(rank.events) == checked  # replayed
    streams[0] = 0x77
    rank.comm.all_gather(x, out)
    assert len(rank.events) > checked  # checked


def test_all_gather_launch_arguments(make_model):
    world, n = 2, 64
    model = make_model(world, 1 << 16)
    x = model.array(0, X_AT, np.ones(32, F32))
    model.register([x, model.array(1, X_AT, np.ones(32, F32))])
    out = model.empty(0, OUT_AT, n, F32, 0)
    rank = model.current = model.ranks[0]
    rank.comm.all_gather(x, out)
    (event,) = rank.events  # registered: no copy
    assert event[4] == (rank.registered[(x.ptr, x.nbytes)], 0, 0, out.ptr, rank.state, 64, 32,
                        0, 32, 10**9, layout.signature("all_gather", 64, F32, True), 0)


# --- argument errors --------------------------------------------------------------------

@pytest.fixture
def rank1(make_model):
    """Rank 1 of 4."""
    return make_model(4, 1 << 16), 1


def test_reduce_scatter_refuses_a_wrong_out(rank1):
    model, r = rank1
    comm = model.ranks[r].comm
    x = model.array(r, X_AT, np.ones(100, F16))  # shard 32: rank 1 owns 32..64
    with pytest.raises(ValueError, match=r"out has shape \(31,\) and dtype float16; expected "
                                         r"\(32,\) and float16 or float32 \(this rank's shard "
                                         r"of 100 elements\)"):
        comm.reduce_scatter(x, model.empty(r, OUT_AT, 31, F16, 0))
    with pytest.raises(ValueError, match="expected .* float16 or float32"):
        comm.reduce_scatter(x, model.empty(r, OUT_AT, 32, BF16, 0))
    with pytest.raises(ValueError, match="overlaps the input x"):
        comm.reduce_scatter(x, pyar.DeviceArray.from_pointer(x.ptr + 64, (32,), F16, device=0))
    with pytest.raises(ValueError, match="read-only"):
        comm.reduce_scatter(x, pyar.DeviceArray.from_pointer(
            model.ranks[r].region + OUT_AT, (32,), F16, device=0, readonly=True))
    with pytest.raises(ValueError, match="16-byte aligned"):
        comm.reduce_scatter(x, pyar.DeviceArray.from_pointer(
            model.ranks[r].region + OUT_AT + 2, (32,), F16, device=0))
    f32 = model.array(r, X_AT, np.ones(100, F32))
    with pytest.raises(ValueError, match="expected .* and float32 "):
        comm.reduce_scatter(f32, model.empty(r, OUT_AT, 25, F16, 0))  # float32: no narrowing
    with pytest.raises(TypeError, match="host"):
        comm.reduce_scatter(np.ones(100, F16))
    assert model.ranks[r].events == []  # nothing was launched


def test_all_gather_refuses_wrong_arguments(rank1):
    model, r = rank1
    comm = model.ranks[r].comm
    x = model.array(r, X_AT, np.ones(32, F32))  # n = 100 on 4 ranks: shard 28
    with pytest.raises(TypeError, match="all_gather needs out= or n="):
        comm.all_gather(x)
    with pytest.raises(ValueError, match=r"x has 32 elements; rank 1's shard of 100 elements "
                                         r"on 4 ranks has 28 \(elements 28\.\.56: shards of "
                                         r"28 in rank order"):
        comm.all_gather(x, model.empty(r, OUT_AT, 100, F32, 0))
    for bad in (-1, True, 100.0, np.int64(-1), "100"):
        with pytest.raises(ValueError, match="n must be a non-negative int"):
            comm.all_gather(x, n=bad)
    x = model.array(r, X_AT, np.ones(28, F32))
    model.current = model.ranks[r]
    out = model.empty(r, OUT_AT, 100, F32, 0)
    assert comm.all_gather(x, out, n=np.int64(100)) is out  # any integer type
    model.ranks[r].events.clear()
    with pytest.raises(ValueError, match=r"expected \(100,\) \(100 elements\) and float32"):
        comm.all_gather(x, model.empty(r, OUT_AT, 101, F32, 0), n=100)
    with pytest.raises(ValueError, match="expected"):
        comm.all_gather(x, model.empty(r, OUT_AT, 100, F16, 0))
    out = pyar.DeviceArray.from_pointer(x.ptr - 16, (100,), F32, device=0)
    with pytest.raises(ValueError, match=r"overlaps the input x; .* \(112 bytes in\)"):
        comm.all_gather(x, out)
    assert model.ranks[r].events == []


def test_all_gather_in_place_and_any_shape(make_model):
    """x at this rank's shard of out is in place; out may have any shape of n elements."""
    world, n = 4, 128
    model = make_model(world, 1 << 16)
    whole = np.arange(n, dtype=F32)
    outs, xs = [], []
    for r in range(world):
        out = model.array(r, OUT_AT, np.full(n, np.nan, F32))
        start, end = shards.bounds(n, world, 4, r)
        model.view(out.ptr + start * 4, end - start, F32)[:] = whole[start:end]
        outs.append(out.reshape(8, 16))
        xs.append(pyar.DeviceArray.from_pointer(out.ptr + start * 4, (end - start,), F32,
                                                device=0))
    model.call("all_gather", [(x, out) for x, out in zip(xs, outs)])
    model.run()
    for out in outs:
        assert np.array_equal(model.view(out.ptr, n, F32), whole)


def test_uneven_all_gather_stages_even_registered_buffers(make_model):
    """Shards of different lengths are different buffer sizes, which ranks cannot
    register together: such an all_gather stages, so every rank agrees."""
    world, n = 2, 20  # shards 12 and 8
    model = make_model(world, 1 << 16)
    xs = [model.array(0, X_AT, np.ones(12, F32)), model.array(1, X_AT, np.ones(8, F32))]
    model.ranks[0].registered[(xs[0].ptr, xs[0].nbytes)] = REGISTERED_TABLE
    outs = [model.empty(r, OUT_AT, n, F32, 0) for r in range(world)]
    model.call("all_gather", [(x, out) for x, out in zip(xs, outs)])
    for rank in model.ranks:
        kernel = [e for e in rank.events if e[0] == "kernel"][0]
        assert kernel[4][0] == STAGED_TABLE
    model.run()


def test_world_of_one_copies(make_model):
    model = make_model(1, 1 << 16)
    rank = model.current = model.ranks[0]
    comm = rank.comm
    x = model.array(0, X_AT, np.arange(9, dtype=F16))
    out = model.empty(0, OUT_AT, 9, F16, 0)
    assert comm.reduce_scatter(x, out) is out
    assert comm.all_gather(x, out) is out
    assert rank.events == [("copy", out.ptr, x.ptr, 18)] * 2
    with pytest.raises(ValueError, match=r"expected \(9,\) and float16 "):
        comm.reduce_scatter(x, model.empty(0, OUT_AT, 9, F32, 0))  # no widening kernel


def test_empty_arrays_launch_nothing(rank1):
    model, r = rank1
    comm = model.ranks[r].comm
    x = model.array(r, X_AT, np.ones(0, F32))
    out = model.empty(r, OUT_AT, 0, F32, 0)
    assert comm.reduce_scatter(x, out) is out
    assert comm.all_gather(x, out) is out
    assert model.ranks[r].events == []


# --- the kernels the host asks for ---------------------------------------------------

SHARDS_SOURCE = os.path.join(ROOT, "src", "kernels", "shards.cu")
_KINDS = {"const pyar::InputTable *": "ptr", "OutT *": "ptr", "T *": "ptr",
          "const pyar::CommState *": "ptr", "uint64_t": "uint64", "uint32_t": "uint32"}


def _macro(source, name):
    body = re.search(r"#define %s\b(.*?)(?<!\\)\n" % name, source, re.S)
    assert body, f"macro {name} not found in shards.cu"
    return body.group(1).replace("\\\n", " ")


def _parameter_kinds(text):
    kinds = []
    for p in text.split(","):
        ctype = " ".join(re.match(r"(.*?)\w+$", p.strip()).group(1).split())
        kinds.append(_KINDS[ctype])
    return tuple(kinds)


def _shard_entries(source):
    """{kernel name: parameter kinds} that shards.cu's macros define."""
    worlds = [int(w) for w in re.findall(r"M\(__VA_ARGS__, (\d+)\)",
                                         _macro(source, "PYAR_SHARD_WORLDS"))]
    shared = _macro(source, "PYAR_SHARD_PARAMS")
    entries = {}
    for operation, macro in (("reduce_scatter", "PYAR_REDUCE_SCATTER_ENTRY"),
                             ("all_gather", "PYAR_ALL_GATHER_ENTRY")):
        params = re.search(r"_w##W\((.*?)\)\s*\{", _macro(source, macro), re.S).group(1)
        kinds = _parameter_kinds(params.replace("PYAR_SHARD_PARAMS", shared))
        for name in re.findall(r"^PYAR_SHARD_WORLDS\(%s, (\w+)," % macro, source, re.M):
            for world in worlds:
                entries[f"pyar_{operation}_{name}_w{world}"] = kinds
    return entries


def test_host_asks_for_exactly_the_shard_kernels_the_source_defines():
    """Names and parameter kinds of src/kernels/shards.cu (PLAN section 2)."""
    with open(SHARDS_SOURCE) as f:
        entries = _shard_entries(f.read())
    assert len(entries) == (5 + 3) * 7, sorted(entries)
    asked = set()
    for world in range(2, 9):
        module = RecordingModule()
        kernel_set = kernels.KernelSet(world, RecordingModule(), module, rows=None)
        kernel_set.every_shard()
        kernel_set.every_shard()  # cached: asked once
        assert len(module.requests) == 8
        for name, argtypes in module.requests:
            assert entries.get(name) == argtypes, (name, argtypes, entries.get(name))
            asked.add(name)
    assert asked == set(entries)
