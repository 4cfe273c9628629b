"""What allreduce_rmsnorm queues, without a GPU (tier a): each variant's
launches chunk by chunk, passed by the kernels' parameter names; split's
two kernels; lamport's one launch; the unfused steps and their sum array.

How this runs without a GPU:

* Calls go through ``comm.allreduce_rmsnorm`` on a NodeCommunicator
  assembled over stand-ins (tests/comm_stand_ins.py, tests/row_stand_ins.py):
  a made-up NodeGeometry, a real kernels.KernelSet over recording modules
  whose functions log every launch in order, and a registry stand-in that
  says which inputs are registered.  The ``sequences`` fixture records the
  plan each call is kept as, and each replay.
* The planner (pyar.comm.fused_plan) is also called directly with such a
  geometry and KernelSet, where a test is about one plan's steps.
* The parameter names come from the kernel source
  (tests/row_kernel_source.py), so each argument is checked by its name.
* pyar._hip.memcpy_dtod (the staging copy) and pyar.comm.communicator.empty
  (the unfused path's sum array) are replaced to record; nothing is
  dereferenced.
* The communicator's call log is read where a user reads it: in the
  CollectiveTimeout the next call raises once the error record (ctypes
  words the test writes, as a kernel would) names a call.
"""
import pytest

pytest.importorskip("mpi4py")  # pyar.comm initializes MPI (a singleton here)

from pyar import _hip  # noqa: E402
from pyar.comm import algorithms, communicator as communicator_module  # noqa: E402
from pyar.comm import fused_plan, kernels, layout  # noqa: E402
from pyar.comm.errors import CollectiveTimeout  # noqa: E402
from tests.comm_stand_ins import (  # noqa: E402,F401 - sequences: the fixture
    BF16, RegistryStandIn, error_record, geometry, sequences,
)
from tests.row_kernel_source import (  # noqa: E402,F401 - source: the fixture
    ROW_FIELDS, fused_entries, lamport_entries, local_entries, names_of, source, split_entries,
)
from tests.row_stand_ins import (  # noqa: E402,F401 - dev: the fixture
    STREAM, RecordedKernels, communicator, dev, fused_blocks, rmsnorm_arguments, row_call,
    row_call_of,
)

REGISTERED = 0x5300_0000_0000


def reported_call(words, number, call_again):
    """How the communicator describes its call ``number``: the error record
    names that call as failed, so ``call_again()`` raises CollectiveTimeout."""
    words[kernels.FAILED], words[kernels.CALL], words[kernels.MISSING + 1] = 1, number, 1
    with pytest.raises(CollectiveTimeout) as error:
        call_again()
    return error.value.call


@pytest.fixture
def copies(monkeypatch):
    """The staging copies queued (pyar._hip.memcpy_dtod)."""
    queued = []
    monkeypatch.setattr(_hip, "memcpy_dtod",
                        lambda dst, src, n, stream=None: queued.append((dst, src, n, stream)))
    return queued


@pytest.mark.parametrize("registered", [None, REGISTERED])
def test_fused_call_passes_each_chunk_by_parameter_name(source, dev, sequences, copies,
                                                        registered):
    names = names_of(fused_entries(source)[1])
    tokens, hidden = 10, 1024
    row = hidden * 2
    words, registry = error_record(), RegistryStandIn()
    # 4 rows a chunk: 4 + 4 + 2
    comm, recorded = communicator(4, max_size=4 * row, registry=registry, words=words)
    given = rmsnorm_arguments(dev, tokens, hidden, quant="fp8_per_token", out=False)
    x = given["x"]
    if registered is not None:
        registry.tables[(x.ptr, x.nbytes)] = registered
    comm.allreduce_rmsnorm(**given, algo="twostage", stream=STREAM)
    call, launches = row_call_of(given), recorded.take()
    assert {name for name, *_ in launches} == {"pyar_allreduce_rmsnorm_two_stage_bf16_fp8_p1_w4"}
    assert len(launches) == 3
    for number, (first, (_, grid, block, args, stream)) in enumerate(zip((0, 4, 8), launches)):
        count = min(4, tokens - first)
        got = dict(zip(names, args))
        # a block of 128 threads for each row of 1024, on the call's stream
        assert (grid, block, stream) == (count, 128, STREAM)
        assert got["tokens"] == count
        assert tuple(got[f] for f in ROW_FIELDS) == call.row_args(first, count)
        assert got["y"] == 0  # quantized output only: no out
        assert got["state"] == comm.geometry.state
        assert got["timeout_ns"] == comm.geometry.timeout_ns
        assert got["call"] == number
        assert got["signature"] == layout.signature(
            "twostage", count * hidden, x.dtype, registered is not None,
            call.quant_code & 0xF, more=first + count < tokens)
        if registered is None:  # the kernel stages the chunk itself
            assert got["in"] == comm.geometry.staged_table and got["in_offset"] == 0
            assert got["stage_from"] == x.ptr + first * row
        else:
            assert got["in"] == registered and got["stage_from"] == 0
            assert got["in_offset"] == first * row // kernels.PACK_BYTES  # in packs
    assert copies == []
    assert reported_call(words, 2, lambda: comm.allreduce_rmsnorm(
        **given, algo="twostage", stream=STREAM)) == \
        "allreduce_rmsnorm call 2 (twostage, 2 x 1024 bfloat16)"


@pytest.mark.parametrize("registered", [None, REGISTERED])
def test_split_runs_each_chunk_as_its_two_kernels(source, dev, sequences, copies, registered):
    """Per chunk: kernel A on the capped grid (numbered: it spins; a staged
    input it copies into the scratch itself), then add_rmsnorm on this
    rank's gather buffer with the whole GPU's blocks, the chunk's row
    arguments and this rank's failure word (unnumbered: it waits for
    nothing), on the call's stream, in that order."""
    a_names = names_of(split_entries(source)[1])
    b_names = names_of(local_entries(source)["pyar_add_rmsnorm_bf16_mxfp4_p1"])
    tokens, hidden = 10, 4096
    row = hidden * 2
    words, registry = error_record(), RegistryStandIn()
    # 4 rows a chunk: 4 + 4 + 2
    comm, recorded = communicator(8, max_size=4 * row, registry=registry, words=words)
    given = rmsnorm_arguments(dev, tokens, hidden, quant="mxfp4")
    x = given["x"]
    if registered is not None:
        registry.tables[(x.ptr, x.nbytes)] = registered
    comm.allreduce_rmsnorm(**given, algo="split", stream=STREAM)
    call, launches = row_call_of(given), recorded.take()
    kernel_a, kernel_b = "pyar_allreduce_rmsnorm_split_bf16_p1_w8", "pyar_add_rmsnorm_bf16_mxfp4_p1"
    assert set(recorded.functions) == {kernel_a, kernel_b}  # no two-stage kernel
    assert [name for name, *_ in launches] == [kernel_a, kernel_b] * 3
    geometry = comm.geometry
    for number, first in enumerate((0, 4, 8)):
        count = min(4, tokens - first)
        _, grid, block, args, stream = launches[2 * number]
        got = dict(zip(a_names, args))
        # 512 threads a row of 4096 bf16; the cap (40 blocks of 512) beyond 4 rows
        assert (grid, block, stream) == (count, 512, STREAM)
        assert got == {"in": registered or geometry.staged_table,
                       "in_offset": 0 if registered is None else first * row // 16,
                       "stage_from": x.ptr + first * row if registered is None else 0,
                       "tokens": count, "hidden": hidden, "state": geometry.state,
                       "timeout_ns": geometry.timeout_ns, "call": number,
                       "signature": layout.signature("split", count * hidden, x.dtype,
                                                     registered is not None, 2,
                                                     more=first + count < tokens)}
        _, grid, block, args, stream = launches[2 * number + 1]
        got = dict(zip(b_names, args))
        assert (grid, block, stream) == (count, 512, STREAM)
        assert got["x"] == geometry.partial and got["tokens"] == count
        assert got["failed"] == geometry.failed_word
        assert tuple(got[f] for f in ROW_FIELDS) == call.row_args(first, count)
    # The plan numbers kernel A only: its replay starts at call 3.
    plan, = sequences
    assert [step[5] is not None for step in plan.steps] == [True, False] * 3
    comm.allreduce_rmsnorm(**given, algo="split", stream=STREAM)
    assert plan.runs == [(STREAM.handle, 3, 0)]
    assert copies == []
    assert reported_call(words, 2, lambda: comm.allreduce_rmsnorm(
        **given, algo="split", stream=STREAM)) == \
        "allreduce_rmsnorm call 2 (split, 2 x 4096 bfloat16)"


def test_split_norms_on_the_whole_gpu_while_kernel_a_keeps_its_cap(dev):
    """4096 rows of 4096 bf16 at 8 ranks: kernel A on the fused cap, kernel B
    on two 512-thread blocks a multiprocessor like the unfused step."""
    node = geometry(8, max_size=64 << 20, fused_blocks=fused_blocks(split=16))
    call = row_call(dev, tokens=4096, hidden=4096)
    a, b = fused_plan.fused(node, RecordedKernels(8).set, call, algorithms.SPLIT, REGISTERED)
    assert (a.grid, a.block, a.kind) == (16, 512, "allreduce_rmsnorm")
    assert (b.grid, b.block, b.kind) == (node.local_blocks, 512, None) == (264, 512, None)
    assert b.args[:2] == (node.partial, 4096)


def test_lamport_call_passes_its_arguments_by_parameter_name(source, dev, sequences, copies):
    """One launch for the whole input, this rank's own x (no staging, no
    table), the receive region past the two-shot scratch, and a segment of
    the slot in packs."""
    names = names_of(lamport_entries(source)[1])
    registry = RegistryStandIn()
    comm, recorded = communicator(4, registry=registry)  # max_size 1 MiB
    tokens, hidden = 24, 4096
    given = rmsnorm_arguments(dev, tokens, hidden, quant="fp8_per_group")
    x = given["x"]
    registry.tables[(x.ptr, x.nbytes)] = REGISTERED  # peers never read x all the same
    comm.allreduce_rmsnorm(**given, algo="lamport", stream=STREAM)
    (name, grid, block, args, stream), = recorded.take()
    assert name == "pyar_allreduce_rmsnorm_lamport_bf16_fp8_p1_w4"
    got = dict(zip(names, args))
    geometry = comm.geometry
    # one 512-thread block a row of 4096
    assert (grid, block, stream) == (tokens, 512, STREAM)
    assert tuple(got[f] for f in ROW_FIELDS) == row_call_of(given).row_args(0, tokens)
    assert got["x"] == x.ptr and got["tokens"] == tokens
    assert got["region"] == geometry.lamport_region
    assert got["region_offset"] == geometry.lamport_region - geometry.partial == comm.max_size
    assert got["segment"] == (1 << 20) // 16
    assert got["signature"] == layout.signature("lamport", tokens * hidden, x.dtype, False,
                                                row_call_of(given).quant_code & 0xF)
    assert got["call"] == 0 and got["state"] == geometry.state
    assert copies == []


@pytest.fixture
def allocated(monkeypatch, dev):
    """The arrays the communicator allocates (pyar.comm.communicator.empty)."""
    made = []

    def empty(shape, dtype, stream=None):
        made.append(dev(shape, dtype))
        return made[-1]

    monkeypatch.setattr(communicator_module, "empty", empty)
    return made


@pytest.mark.parametrize("with_out", [True, False])
def test_unfused_runs_the_allreduce_then_the_local_row_kernel(dev, sequences, allocated,
                                                              with_out):
    """Past the crossover: pyar's all-reduce into out (or the communicator's
    sum array when only quantized output is wanted), then add + RMSNorm +
    quantization on that sum with the call's own outputs; no fused kernel.
    The steps are the call's plan, so that the call is replayed."""
    comm, recorded = communicator(4)
    tokens, hidden = 6, 4096
    given = rmsnorm_arguments(dev, tokens, hidden, quant="mxfp4", out=with_out)
    x = given["x"]
    comm.allreduce_rmsnorm(**given, algo="unfused", stream=STREAM)
    allreduce = kernels.allreduce_name(algorithms.choose(x.nbytes, 4), BF16, 4)
    add = "pyar_add_rmsnorm_bf16_mxfp4_p1"
    (reduce_name, _, _, reduce_args, _), (name, grid, block, args, stream) = recorded.take()
    assert (reduce_name, name) == (allreduce, add)
    # ALLREDUCE_ARGS: table, in_offset, stage_from, out, state, n, ...: x
    # staged (not registered), all of it reduced
    assert reduce_args[:3] == (comm.geometry.staged_table, 0, x.ptr)
    sums = reduce_args[3]
    assert reduce_args[5] == x.size
    if with_out:
        assert sums == given["out"].ptr and allocated == []
    else:  # the communicator's sum array, the size of x
        (kept,) = allocated
        assert kept.nbytes == x.nbytes and sums == kept.ptr
    assert [name for name, _ in recorded.rows.module.requests] == [add]
    assert (grid, block, stream) == (tokens, 512, STREAM)
    # in place over the sums, no failure word
    assert args == (sums, tokens, *row_call_of(given).row_args(0, tokens), 0)
    plan, = sequences
    assert [(step[1].name, step[5] is not None) for step in plan.steps] == [
        (allreduce, True), (add, False)]
    comm.allreduce_rmsnorm(**given, algo="unfused", stream=STREAM)
    assert len(plan.runs) == 1 and recorded.take() == []


def test_unfused_keeps_its_sum_array_for_later_calls(dev, sequences, allocated):
    """The sum array is allocated on first use, when plans that may name the
    array it replaces are forgotten, and kept: its kernels are still queued
    and plans name it.  A later call of no larger input reuses it and
    forgets no plan."""
    comm, recorded = communicator(4)
    tokens, hidden = 6, 4096

    def call(given):
        comm.allreduce_rmsnorm(**given, algo="unfused", stream=STREAM)
        return recorded.take()

    with_out = rmsnorm_arguments(dev, tokens, hidden, quant="mxfp4")
    call(with_out)
    first = rmsnorm_arguments(dev, tokens, hidden, quant="mxfp4", out=False)
    (_, _, _, reduce_args, _), _ = call(first)
    (kept,) = allocated
    assert reduce_args[3] == kept.ptr
    assert len(sequences) == 2
    call(with_out)  # its plan was forgotten: planned again, not replayed
    assert len(sequences) == 3 and sequences[0].runs == []
    second = rmsnorm_arguments(dev, tokens, hidden, quant="mxfp4", out=False)
    (_, _, _, reduce_args, _), _ = call(second)
    assert allocated == [kept] and reduce_args[3] == kept.ptr
    assert call(with_out) == call(first) == []  # both plans kept: replayed
    assert len(sequences[2].runs) == len(sequences[1].runs) == 1
