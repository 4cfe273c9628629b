"""The LL all-reduce's host side without a GPU (tier a): its entry points and
argument types against allreduce.cu, its receive region against pyar_ll.h,
the planner's one launch (by parameter name, never staged nor registered),
its refusals, "auto" choosing it only up to the node's auto_ll_bytes
(unless PYAR_AUTO_LL=0), and whole calls through a NodeCommunicator assembled over
the stand-ins of tests/comm_stand_ins.py.
"""
import os
import re

import numpy as np
import pytest

pytest.importorskip("mpi4py")

from pyar.comm import algorithms, kernels, layout, plan  # noqa: E402
from pyar.comm.plan import Launch  # noqa: E402
from tests.comm_stand_ins import (  # noqa: E402
    BF16, F16, F32, RecordingKernels, RecordingModule, RegistryStandIn, array, assemble,
    geometry,
)
from tests.comm_stand_ins import capturing, copies, sequences  # noqa: E402,F401 - fixtures
from tests.mpi_launch import ROOT  # noqa: E402

KERNELS = os.path.join(ROOT, "src", "kernels")
X, OUT = 0x7000_0000_0000, 0x7100_0000_0000
# The LL entry's parameters, by name (PYAR_LL_ENTRY in allreduce.cu).
PARAMETERS = ("x", "out", "state", "region", "region_offset", "capacity", "n", "timeout_ns",
              "signature", "call")
C_KINDS = {"const void *": "ptr", "void *": "ptr", "const pyar::CommState *": "ptr",
           "uint64_t": "uint64", "uint32_t": "uint32"}


def _read(name):
    with open(os.path.join(KERNELS, name)) as f:
        return f.read()


def _ll_entries():
    """(entry names, [(C type, parameter name)]) the LL macros of allreduce.cu define."""
    source = _read("allreduce.cu")
    entry = re.search(r"#define PYAR_LL_ENTRY\(kind, fn, name, T, W\)(.*?)\{", source, re.S)
    params = re.search(r"_w##W\((.*?)\)", entry.group(1).replace("\\", ""), re.S).group(1)
    typed = [re.match(r"(.*?)(\w+)$", p.strip()).groups() for p in params.split(",")]
    typed = [(" ".join(c.split()).replace(" *", " *"), n) for c, n in typed]
    worlds = re.findall(r"^\s*PYAR_LL_ENTRY\(kind, fn, name, T, (\d+)\)", source, re.M)
    types = re.findall(r"^\s*PYAR_LL_WORLDS\(kind, fn, (\w+), [\w:]+\)", source, re.M)
    kinds = re.findall(r"^PYAR_LL_TYPES\((\w+), \w+\)", source, re.M)
    return {f"pyar_allreduce_{k}_{t}_w{w}" for k in kinds for t in types for w in worlds}, typed


def test_ll_entries_are_the_ones_the_host_asks_for():
    names, typed = _ll_entries()
    assert len(names) == 2 * 3 * 7, sorted(names)
    assert tuple(n for _, n in typed) == PARAMETERS
    assert tuple(C_KINDS[c] for c, _ in typed) == kernels.LL_ARGS
    for world in range(2, 9):
        module = RecordingModule()
        kernel_set = kernels.KernelSet(world, module, RecordingModule(), rows=None)
        for algo in algorithms.LL_ALGORITHMS:
            for dtype in kernels.DTYPE_NAMES:
                kernel_set.allreduce(algo, dtype)
        assert {(n, a) for n, a in module.requests} == {
            (kernels.allreduce_name(algo, d, world), kernels.LL_ARGS)
            for algo in algorithms.LL_ALGORITHMS for d in kernels.DTYPE_NAMES}
        assert {n for n, _ in module.requests} <= names


def test_every_allreduce_includes_the_ll_kernels():
    """They spin like the barrier kernels: their occupancy bounds the block cap too."""
    module = RecordingModule()
    kernels.KernelSet(4, module, RecordingModule(), rows=None).every_allreduce()
    asked = {n for n, _ in module.requests}
    assert {kernels.allreduce_name(a, d, 4) for a in algorithms.LL_ALGORITHMS
            for d in kernels.DTYPE_NAMES} <= asked
    assert len(asked) == 4 * 3


def test_region_layout_matches_the_kernel():
    """Header: a uint32 call count per block (kLamportHeaderBytes = kMaxBlocks * 4); two
    generations of world segments of 8-byte packets, 4 bytes of data each."""
    ll, lamport = _read("pyar_ll.h"), _read("pyar_lamport.h")
    assert "constexpr int kLLGenerations = 2;" in ll
    assert "constexpr int kLLHeaderBytes = kLamportHeaderBytes;" in ll
    assert "constexpr int kLamportHeaderBytes = kMaxBlocks * 4;" in lamport
    assert layout.LL_GENERATIONS == 2 and layout.LL_PACKET_BYTES == 8
    assert layout.ll_region_bytes(8, 256 << 10, 256) == 1024 + 2 * 8 * 2 * (256 << 10)


def test_the_size_table_never_picks_ll_but_it_may_be_forced():
    for world in range(2, 9):
        for nbytes in (0, 16, 4096, 64 << 10, 1 << 20):
            assert algorithms.choose(nbytes, world) in algorithms.ALGORITHMS
    assert algorithms.validate("ll") == "ll"
    assert plan.ll_segment(1 << 30) == algorithms.LL_MAX_BYTES and plan.ll_segment(4096) == 4096


def test_auto_ll_bound_is_the_table_within_the_segment_and_only_where_enabled():
    for world in range(2, 9):
        bound = algorithms.LL_AUTO_MAX_BYTES[world]
        assert 0 < bound <= algorithms.LL_MAX_BYTES
        assert plan.auto_ll_bytes(world, algorithms.LL_MAX_BYTES, False) == 0
        assert plan.auto_ll_bytes(world, algorithms.LL_MAX_BYTES, True) == bound
        assert plan.auto_ll_bytes(world, 4096, True) == min(bound, 4096)
    assert plan.auto_ll_bytes(1, algorithms.LL_MAX_BYTES, True) == 0
    assert set(algorithms.LL_AUTO_MAX_BYTES) == set(range(2, 9))
    assert "LL_AUTO_MAX_BYTES" in algorithms.PROVENANCE


@pytest.mark.parametrize("world", [2, 4, 8])
def test_auto_runs_ll_up_to_its_bound(world):
    """Up to auto_ll_bytes "auto" runs LL, in place over a registered input too (LL
    reads it in place; the barrier one-shot may not); one element past it, or with
    the bound 0 (PYAR_AUTO_LL=0), the size table's choice; never an input LL
    refuses (misaligned)."""
    bound = plan.auto_ll_bytes(world, algorithms.LL_MAX_BYTES, True)
    node = geometry(world=world, max_size=1 << 20, auto_ll_bytes=bound)
    off = geometry(world=world, max_size=1 << 20)
    at, past = array(X, bound // 2, BF16), array(X, bound // 2 + 1, BF16)
    out = array(OUT, bound // 2, BF16)
    assert plan.allreduce_algorithm(node, at, out, "auto", None) == "ll"
    assert plan.allreduce_algorithm(node, at, at, "auto", 0x5300_0000_0000) == "ll"
    assert plan.allreduce_algorithm(node, past, past, "auto", None) == \
        algorithms.choose(past.nbytes, world)
    assert plan.allreduce_algorithm(off, at, out, "auto", None) == \
        algorithms.choose(at.nbytes, world)
    assert plan.allreduce_algorithm(off, at, at, "auto", 0x5300_0000_0000) == "twoshot"
    odd = array(X + 2, 16, F32)
    assert plan.allreduce_algorithm(node, odd, odd, "auto", None) != "ll"


def test_an_auto_call_under_the_bound_is_one_ll_launch(copies, sequences):
    """comm.allreduce(x) on a node whose auto_ll_bytes covers x: the LL kernel, no
    staging copy; a larger call the barrier one-shot with its staging."""
    comm = assemble(4, max_size=1 << 20, auto_ll_bytes=8192)
    small, large = array(X, 4096, BF16), array(X, 4097, BF16)
    comm.allreduce(small, array(OUT, 4096, BF16))
    comm.allreduce(large, array(OUT, 4097, BF16))
    names = [f.name for f in comm.kernels.functions.values() if f.launches]
    assert names == [kernels.allreduce_name("ll", BF16, 4),
                     kernels.allreduce_name("oneshot", BF16, 4)]
    assert copies == []


@pytest.mark.parametrize("dtype, count", [(F32, 1000), (F16, 1001), (BF16, 7)])
def test_planner_ll_step(dtype, count):
    """One launch reading x in place (no copy, no table), arguments by parameter name."""
    node = geometry(world=4, max_size=1 << 20)
    x, out = array(X, count, dtype), array(OUT, count, dtype)
    assert plan.allreduce_algorithm(node, x, out, "ll", None) == "ll"
    (step,) = plan.allreduce(node, RecordingKernels(4), x, out, "ll", None)
    assert type(step) is Launch and step.kind == "allreduce"
    got = dict(zip(PARAMETERS, step.args))
    assert got == {"x": X, "out": OUT, "state": node.state, "region": node.ll_region,
                   "region_offset": node.ll_region - node.partial,
                   "capacity": node.ll_bytes // 4, "n": count, "timeout_ns": node.timeout_ns,
                   "signature": layout.signature("ll", count, dtype, False)}
    words = -(-count * dtype.itemsize // 4)
    assert (step.grid, step.block) == (min(3, -(-words // 512)), 512)
    assert step.details == f"(ll, {count} x {dtype})"


def test_planner_refuses_ll_over_its_segment_or_misaligned():
    node = geometry(world=4, max_size=1 << 20)
    limit = node.ll_bytes
    assert limit == algorithms.LL_MAX_BYTES
    fits = array(X, limit // 4, F32)
    assert plan.allreduce_algorithm(node, fits, fits, "ll", None) == "ll"
    big = array(X, limit // 4 + 1, F32)
    with pytest.raises(ValueError, match=f"algo='ll' takes inputs of at most {limit} bytes"):
        plan.allreduce_algorithm(node, big, big, "ll", None)
    odd = array(X + 2, 16, F32)
    with pytest.raises(ValueError, match="aligned to their element size"):
        plan.allreduce_algorithm(node, odd, odd, "ll", None)


def test_a_forced_call_is_one_launch_never_staged_nor_registered(copies, sequences):
    """comm.allreduce(algo="ll"), in place and not: one LL launch per call, no copy, the
    registry never asked (an input registered on every rank is still read in place), the
    call number after the arguments; a replay of the same call runs its plan."""
    registry = RegistryStandIn()
    x, out = array(X, 4096, BF16), array(OUT, 4096, BF16)
    registry.tables[(x.ptr, x.nbytes)] = 0x5300_0000_0000
    comm = assemble(4, max_size=8192, registry=registry)
    assert comm.allreduce(x, out, algo="ll") is out
    assert comm.allreduce(x, x, algo="ll") is x
    (function,) = comm.kernels.functions.values()
    assert function.name == kernels.allreduce_name("ll", BF16, 4)
    assert function.argtypes == kernels.LL_ARGS
    assert [dict(zip(PARAMETERS, a))["out"] for _, _, a, _ in function.launches] == [OUT, X]
    assert [a[-1] for _, _, a, _ in function.launches] == [0, 1]  # the call numbers
    assert copies == [] and registry.deferred == []
    assert comm.allreduce(x, out, algo="ll") is out  # replayed from its plan
    assert any(seq.runs for seq in sequences)


def test_a_forced_call_over_the_limit_is_refused_at_every_world_size():
    for world in (1, 4):
        comm = assemble(world, max_size=4096)
        with pytest.raises(ValueError, match="at most 4096 bytes"):
            comm.allreduce(array(X, 4096, F16), array(OUT, 4096, F16), algo="ll")


def test_a_captured_call_defers_no_registration(sequences, capturing):
    """Captured, a barrier call defers its input's registration to the exchange at the
    end of the capture (peers read it in place); an LL call reads only its own input and
    defers nothing: it needs no buffer exchange."""
    registry = RegistryStandIn()
    comm = assemble(4, registry=registry)
    x, out = array(X, 1000, F16), array(OUT, 1000, F16)
    capturing.add(0x1234)
    comm.allreduce(x, out, algo="ll", stream=0x1234)
    assert registry.deferred == []
    comm.allreduce(x, out, algo="oneshot", stream=0x1234)
    assert registry.deferred == [x]


def test_ranks_that_disagree_on_auto_ll_refuse_to_connect(monkeypatch):
    """PYAR_AUTO_LL on some ranks only would give one "auto" call LL on some ranks and
    a barrier kernel on others: construction raises MismatchError, before any GPU step."""
    from pyar.comm.communicator import NodeCommunicator
    from pyar.comm.errors import MismatchError
    from tests.comm_stand_ins import NodeStandIn

    class Peers(NodeStandIn):
        def allgather(self, value):  # rank 1 runs without PYAR_AUTO_LL
            return [value, (*value[:-1], not value[-1]), value, value]

    monkeypatch.setenv("PYAR_AUTO_LL", "1")
    node = Peers(4, 0)
    with pytest.raises(MismatchError, match=r"max_size, timeout and PYAR_AUTO_LL"):
        NodeCommunicator(node)
    assert node.freed


@pytest.mark.parametrize("setting, enabled", [(None, True), ("", True), ("1", True),
                                              ("0", False), ("no", False), ("false", False)])
def test_auto_ll_is_on_unless_pyar_auto_ll_turns_it_off(monkeypatch, setting, enabled):
    """What a rank offers for agreement at construction: "auto" runs LL unless
    PYAR_AUTO_LL is 0, no or false."""
    from pyar.comm.communicator import NodeCommunicator
    from pyar.comm.errors import MismatchError
    from tests.comm_stand_ins import NodeStandIn

    offered = []

    class Peers(NodeStandIn):
        def allgather(self, value):  # a peer that disagrees ends construction here
            offered.append(value[-1])
            return [value, (*value[:-1], not value[-1])]

    if setting is None:
        monkeypatch.delenv("PYAR_AUTO_LL", raising=False)
    else:
        monkeypatch.setenv("PYAR_AUTO_LL", setting)
    with pytest.raises(MismatchError, match=r"PYAR_AUTO_LL"):
        NodeCommunicator(Peers(2, 0))
    assert offered == [enabled]


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_planner_ll_twoshot_step_and_limit(world):
    """The two-shot: one launch with LL's arguments, a thread per word of a rank's shard;
    inputs up to world halves of a segment, refused past them (also through the
    communicator, at every world size alike)."""
    node = geometry(world=world, max_size=1 << 20)
    largest = plan.ll_largest("ll_twoshot", node.ll_bytes, world)
    assert largest == world * node.ll_bytes // 2
    fits, over = array(X, largest // 4, F32), array(X, largest // 4 + 1, F32)
    assert plan.allreduce_algorithm(node, fits, fits, "ll_twoshot", None) == "ll_twoshot"
    with pytest.raises(ValueError, match=f"algo='ll_twoshot' takes inputs of at most {largest}"):
        plan.allreduce_algorithm(node, over, over, "ll_twoshot", None)
    count = 100_003
    x, out = array(X, count, BF16), array(OUT, count, BF16)
    (step,) = plan.allreduce(node, RecordingKernels(world), x, out, "ll_twoshot", None)
    got = dict(zip(PARAMETERS, step.args))
    assert got["capacity"] == node.ll_bytes // 4 and got["n"] == count
    assert got["signature"] == layout.signature("ll_twoshot", count, BF16, False)
    assert got["signature"] != layout.signature("ll", count, BF16, False)
    shard_words = -(-(-(-count * 2 // 4)) // world)
    assert step.grid == min(3, -(-shard_words // 512))
    assert step.details == f"(ll_twoshot, {count} x {BF16})"


def test_a_forced_twoshot_call_is_one_launch_in_place_too(copies, sequences):
    comm = assemble(8, max_size=1 << 20)
    x, out = array(X, 300_000, F16), array(OUT, 300_000, F16)  # 600 KB: past one segment
    assert comm.allreduce(x, out, algo="ll_twoshot") is out
    assert comm.allreduce(x, x, algo="ll_twoshot") is x
    (function,) = comm.kernels.functions.values()
    assert function.name == kernels.allreduce_name("ll_twoshot", F16, 8)
    assert copies == []
    with pytest.raises(ValueError, match="algo='ll' takes inputs of at most"):
        comm.allreduce(x, out, algo="ll")
