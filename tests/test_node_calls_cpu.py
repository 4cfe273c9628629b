"""A node communicator's all-reduce without a GPU (tier a): the planner's
chunks (pyar.comm.plan), the launches a whole call queues, and what the
kernels' error record turns into (MismatchError, CollectiveTimeout).

The planner runs on a made-up geometry and recording kernels; whole calls
run on a real NodeCommunicator assembled over the stand-ins of
tests/comm_stand_ins.py, its staging copies recorded through a
monkeypatched ``memcpy_dtod`` and its plans compiled into a recording
sequence.  A recorded failure is written into the communicator's error
record as a kernel writes it, and the next call reads it.
"""
import pickle

import numpy as np
import pytest

pytest.importorskip("mpi4py")

from pyar.comm import kernels, layout, plan  # noqa: E402
from pyar.comm.errors import CollectiveTimeout, MismatchError  # noqa: E402
from pyar.comm.plan import Launch  # noqa: E402
from tests.comm_stand_ins import (  # noqa: E402
    BF16, F16, RecordingKernels, RegistryStandIn, array, assemble, error_record, geometry,
)
from tests.comm_stand_ins import copies, sequences  # noqa: E402,F401 - fixtures

REGISTERED_TABLE = 0x5300_0000_0000
X, OUT = 0x7000_0000_0000, 0x7100_0000_0000


# --- chunks --------------------------------------------------------------------------

def test_a_chunked_call_never_agrees_with_calls_of_its_chunks():
    """One rank's all-reduce of two chunks against another's two all-reduces of one
    chunk each: the launches pair up with the same element counts, and only the
    signature's "more chunks follow" bit tells the first pair apart, so the start
    barrier's check fails there instead of each rank summing the other's halves."""
    node = geometry(world=4, max_size=4096)
    signatures = {}
    for name, sizes in (("one call", [4096]), ("two calls", [2048, 2048])):
        launches = []
        for size in sizes:
            x = array(X, size, F16)
            launches += [step for step in plan.allreduce(node, RecordingKernels(4), x, x,
                                                         "twoshot", REGISTERED_TABLE)
                         if type(step) is Launch]
        signatures[name] = [step.args[7] for step in launches]
    one, two = signatures["one call"], signatures["two calls"]
    assert len(one) == len(two) == 2
    decoded = [layout.decode_signature(v) for v in one + two]
    assert {d.elements for d in decoded} == {2048}
    assert one[0] != two[0] and one[1] == two[1]


@pytest.mark.parametrize("registered, x_ptr", [(None, X), (None, X + 2),
                                               (REGISTERED_TABLE, X)],
                         ids=["staged", "staged-unaligned", "registered"])
def test_launch_chunks_through_the_scratch_or_the_registered_table(copies, sequences, registered,
                                                                   x_ptr):
    """Messages larger than max_size go in chunks: staged ones read through the
    staged table, each kernel copying its chunk into the scratch itself (no
    copy queued; an input that is not 16-byte aligned is copied chunk by chunk
    first and the kernel stages nothing), registered ones read in place at an
    offset; parameters by the kernel's names."""
    itemsize, max_size = 2, 4096
    count = 2 * max_size // itemsize + 1000  # two whole chunks and a short one
    x = array(x_ptr, count, F16)
    out = array(OUT, count, F16)
    registry = RegistryStandIn()
    if registered is not None:  # as register(x) leaves it on every rank
        registry.tables[(x.ptr, x.nbytes)] = registered
    comm = assemble(4, max_size=max_size, registry=registry)
    assert comm.allreduce(x, out, algo="twoshot") is out
    (function,) = comm.kernels.functions.values()
    names = ["in", "in_offset", "stage_from", "out", "state", "n", "timeout_ns", "signature",
             "call"]
    firsts = [0, 2048, 4096]
    assert len(function.launches) == 3
    for number, (first, (grid, block, args, _)) in enumerate(zip(firsts, function.launches)):
        got = dict(zip(names, args))
        n = min(2048, count - first)
        assert got["n"] == n and got["out"] == out.ptr + first * itemsize
        assert got["call"] == number and got["state"] == comm.geometry.state
        assert got["signature"] == layout.signature("twoshot", n, np.float16,
                                                    registered is not None,
                                                    more=first + n < count)
        # Two-shot: each rank reduces a quarter of the chunk's packs, 512 threads a block.
        assert (grid, block) == (min(3, max(1, -(-(n // 8 // 4) // 512))), 512)
        aligned = x.ptr % 16 == 0
        if registered is None:
            assert (got["in"], got["in_offset"]) == (comm.geometry.staged_table, 0)
            assert got["stage_from"] == (x.ptr + first * itemsize if aligned else 0)
        else:
            assert (got["in"], got["in_offset"], got["stage_from"]) == (
                registered, first * itemsize // 16, 0)
    if registered is None and x.ptr % 16:
        scratch = comm.geometry.scratch
        assert copies == [(scratch, x.ptr + f * itemsize, min(2048, count - f) * itemsize)
                          for f in firsts]
    else:
        assert copies == []


# --- the kernels' error record -----------------------------------------------------------

def _after_call_7(world):
    """(communicator, its error record): rank 1 of ``world`` with a 2 s
    timeout, whose calls 0 to 7 were two-shot all-reduces of 4096 bfloat16
    elements (the first checked, the others replayed): call 7 is described
    as "allreduce call 7 (twoshot, 4096 x bfloat16)"."""
    words = error_record()
    comm = assemble(world, rank=1, max_size=8192, words=words, timeout=2.0)
    x, out = array(X, 4096, BF16), array(OUT, 4096, BF16)
    for _ in range(8):
        comm.allreduce(x, out, algo="twoshot")
    return comm, words


def _next_call(comm):
    """An all-reduce of a signature not seen before: checked (the error
    record read) before it launches."""
    return comm.allreduce(array(X, 4096, BF16), array(OUT + 0x10_0000, 4096, BF16),
                          algo="twoshot")


def _write(words, values):
    """Write ``values`` ({word index: value}) as the kernels do."""
    for index, value in values.items():
        words[index] = value


def _signature_words(signatures):
    words = {}
    for rank, value in enumerate(signatures):
        words[kernels.SIGNATURES + 2 * rank] = value & 0xFFFFFFFF
        words[kernels.SIGNATURES + 2 * rank + 1] = value >> 32
    return words


@pytest.mark.parametrize("world", [2, 4, 8])
def test_a_recorded_mismatch_raises_naming_every_rank(sequences, world):
    """The start barrier's record (PLAN section 1) becomes a MismatchError naming
    every rank's decoded call; the communicator stays failed."""
    comm, words = _after_call_7(world)
    calls = [layout.signature("twoshot", 4096, BF16, False)] * world
    calls[-1] = layout.signature("twoshot", 4097, BF16, False)
    _write(words, {kernels.FAILED: 1, kernels.CALL: 7, kernels.MISMATCH: 1,
                   **_signature_words(calls)})
    launched = len(comm.kernels.launches())
    with pytest.raises(MismatchError) as raised:
        _next_call(comm)
    text = str(raised.value)
    assert text.startswith("allreduce call 7 (twoshot, 4096 x bfloat16) on rank 1: ")
    for rank in range(world - 1):
        assert f"rank {rank}: allreduce twoshot 4096 x bfloat16 staged;" in text
    assert f"rank {world - 1}: allreduce twoshot 4097 x bfloat16 staged)" in text
    assert "no rank read another's data" in text
    assert len(comm.kernels.launches()) == launched  # raised before launching
    with pytest.raises(MismatchError) as again:
        comm.synchronize()  # failed: the same error, before any wait
    assert again.value is raised.value
    with pytest.raises(MismatchError):
        _next_call(comm)  # read again, raised again
    copy = pickle.loads(pickle.dumps(raised.value))
    assert type(copy) is MismatchError and str(copy) == text


def test_a_recorded_mismatch_names_dtypes_modes_and_quantization(sequences):
    comm, words = _after_call_7(3)
    calls = [layout.signature("onestage", 4096, BF16, False, 1),
             layout.signature("onestage", 4096, np.float16, True, 2),
             layout.signature("split", 4096, BF16, False, 0)]
    _write(words, {kernels.FAILED: 1, kernels.CALL: 7, kernels.MISMATCH: 1,
                   **_signature_words(calls)})
    with pytest.raises(MismatchError, match=(
            r"rank 0: allreduce_rmsnorm onestage 4096 x bfloat16 staged, fp8 quantization; "
            r"rank 1: allreduce_rmsnorm onestage 4096 x float16 registered, mxfp4 "
            r"quantization; rank 2: allreduce_rmsnorm split 4096 x bfloat16 staged, no "
            r"quantization\)")):
        _next_call(comm)


def test_a_recorded_timeout_still_raises_collective_timeout(sequences):
    comm, words = _after_call_7(4)
    _write(words, {kernels.FAILED: 1, kernels.CALL: 7, kernels.MISSING + 3: 1})
    with pytest.raises(CollectiveTimeout) as raised:
        _next_call(comm)
    assert raised.value.missing == (3,) and "allreduce call 7" in raised.value.call
    assert raised.value.sequence == 7  # the calls before 7 completed on this rank
    assert raised.value.timeout == 2.0 and raised.value.rank == 1


def test_a_clean_record_raises_nothing(sequences):
    comm, _ = _after_call_7(4)
    launched = len(comm.kernels.launches())
    _next_call(comm)
    assert len(comm.kernels.launches()) == launched + 1
