"""The calling convention between the host and the row kernels of
src/kernels/allreduce_rmsnorm.cu, without a GPU (tier a): the entry names
the host asks for, their argument types (pyar.comm.kernels), struct
RowArgs, the layout the host reads, the QuantKind codes, the lamport
region's constants, the launch geometry (row_kernels.row_launch: the
packs per thread that pick a kernel's p<N> instantiation) and the
single-GPU kernels' launches.

How this runs without a GPU:

* The kernel source (with its row code, pyar_rows.h) is parsed
  (tests/row_kernel_source.py): the entry
  names and parameter lists its macros define, ``struct RowArgs``, the
  ``pyar_rmsnorm_layout`` initializer and the ``QuantKind`` codes.
* The host asks recording modules for its kernels (tests/row_stand_ins.py):
  a real kernels.KernelSet and row_kernels.RowKernels over them, whose
  functions record ``launch`` calls and check the arguments the way
  pyar._hip.Function packs them (count, integer kinds in range, float for
  float32).  The layout RowKernels reads is served by the module with the
  values of the kernel constants, which a test holds against the source.
* Arrays are DeviceArrays on made-up addresses (nothing is dereferenced).
"""
import re

import numpy as np
import pytest

pytest.importorskip("mpi4py")  # pyar.comm initializes MPI (a singleton here)

from pyar.comm import algorithms, kernels, layout  # noqa: E402
from pyar.comm.row_kernels import (  # noqa: E402
    QUANT_KINDS, ROW_THREAD_QUANTUM, quant_code, row_launch,
)
from tests.comm_stand_ins import BF16, F16, F32  # noqa: E402
from tests.row_kernel_source import (  # noqa: E402,F401 - source: the fixture
    ROW_FIELDS, constants, device_function, dtype_names, fused_entries, instantiations,
    kinds_of, lamport_entries, local_entries, macro, macro_body, names_of, quant_kinds, read,
    row_params, source, split_entries, struct_fields,
)
from tests.row_stand_ins import (  # noqa: E402,F401 - dev: the fixture
    LAYOUT_VALUES, ROW_LAYOUT, RecordingModule, dev, quant_outputs, row_call, row_kernels,
)

WORLDS = range(2, 9)


def kernel_set(world):
    """A KernelSet of ``world`` ranks whose row kernels record what is asked."""
    return kernels.KernelSet(world, RecordingModule(), RecordingModule(), row_kernels())


def asked_once(kernel_set, names, kinds, count, suffix):
    """The kernels ``kernel_set`` asked its row module for: ``count`` of
    them, each once, each among ``names``, ending in ``suffix`` and taking
    ``kinds``."""
    requests = kernel_set.rows.module.requests
    assert len(requests) == count, requests
    for name, argtypes in requests:
        assert name in names and name.endswith(suffix), name
        assert argtypes == kinds, (name, argtypes)
    return {name for name, _ in requests}


def test_kernel_dtype_names_are_the_hosts(source):
    """The f32/f16/bf16 suffixes instantiate the C types the host's dtypes mean."""
    c_type = {"float": F32, "__half": F16, "pyar::bf16_bits": BF16}
    assert {name: c_type[t] for name, t in dtype_names(source).items()} == {
        name: dtype for dtype, name in kernels.DTYPE_NAMES.items()}


def test_fused_entry_parameters_are_the_fused_types(source):
    _, params = fused_entries(source)
    assert names_of(params) == [
        "in", "in_offset", "stage_from", "tokens", *ROW_FIELDS, "state", "timeout_ns",
        "signature", "call"]
    assert kinds_of(params) == kernels.FUSED_ARGS


def test_host_asks_for_exactly_the_fused_entries_the_source_defines(source):
    names, params = fused_entries(source)
    # 2 variants x 3 kinds x (p1, p2, p4 float32; p1, p2 16-bit) x 7 worlds
    assert len(names) == 2 * 3 * 7 * 7, sorted(names)
    asked = set()
    for world in WORLDS:
        ks = kernel_set(world)
        for variant in algorithms.FUSED_VARIANTS:
            for dtype in kernels.DTYPE_NAMES:
                for per_thread in ROW_LAYOUT.packs_per_thread_choices(dtype.itemsize):
                    for code in kernels.QUANT_KIND_NAMES:
                        first = ks.fused(variant, dtype, code, per_thread)
                        # cached; the FNUZ flag selects no other kernel
                        assert ks.fused(variant, dtype, code | ROW_LAYOUT.fnuz_flag,
                                        per_thread) is first
                # every_fused (the block caps' list) is the same kernels
                assert len(ks.every_fused(variant, dtype)) == 3 * len(
                    ROW_LAYOUT.packs_per_thread_choices(dtype.itemsize))
        asked |= asked_once(ks, names, kinds_of(params), 2 * 3 * 7, f"_w{world}")
    assert asked == names


def test_split_entry_parameters_are_the_split_types(source):
    _, params = split_entries(source)
    assert names_of(params) == [
        "in", "in_offset", "stage_from", "tokens", "hidden", "state", "timeout_ns", "signature",
        "call"]
    assert kinds_of(params) == kernels.SPLIT_ARGS


def test_host_asks_for_exactly_the_split_entries_the_source_defines(source):
    """Split's first kernel: one per (dtype, packs per thread, world), the
    same for every quantization kind (the second kernel, add_rmsnorm, has it)."""
    names, params = split_entries(source)
    assert len(names) == 7 * 7, sorted(names)  # (p1, p2, p4 float32; p1, p2 16-bit) x 7
    asked = set()
    for world in WORLDS:
        ks = kernel_set(world)
        for dtype in kernels.DTYPE_NAMES:
            for per_thread in ROW_LAYOUT.packs_per_thread_choices(dtype.itemsize):
                first = ks.fused(algorithms.SPLIT, dtype, 0, per_thread)
                for code in kernels.QUANT_KIND_NAMES:
                    assert ks.fused(algorithms.SPLIT, dtype, code, per_thread) is first
                    assert ks.fused(algorithms.SPLIT, dtype, code | ROW_LAYOUT.fnuz_flag,
                                    per_thread) is first
        asked |= asked_once(ks, names, kinds_of(params), 7, f"_w{world}")
    assert asked == names


def test_split_first_kernel_is_two_stage_cut_at_mid(source):
    """Kernel A runs two-stage's phase 1 (the same reduce_scatter_rows, so
    the same sums) and its `mid` barrier through mid_barrier (the control
    build's PYAR_TEST_SKIP_MID_BARRIER removes it), then returns: no rows
    normed, no exit barrier, and the written proof of why none is needed."""
    body = device_function(source, "split_reduce")
    assert "reduce_scatter_rows<T, P, W>(src, gather, tokens" in body
    assert body.index("reduce_scatter_rows") < body.index("fence_system()") < body.index(
        "mid_barrier<W>(s, epoch, info)")
    assert "norm_rows" not in body and "exit_barrier" not in body
    proof = source[:source.index("PYAR_DEVICE void split_reduce(")]
    proof = proof[proof.rindex("// Kernel A of split"):]
    for fact in ("No exit barrier (rule 1)", "before `mid`", "stream order",
                 "only p's own memory"):
        assert fact in proof, fact
    assert "mid_barrier<W>(s, epoch, info)" in device_function(source, "two_stage")


def test_lamport_entry_parameters_are_the_lamport_types(source):
    _, params = lamport_entries(source)
    assert names_of(params) == [
        "x", "tokens", *ROW_FIELDS, "state", "region", "region_offset", "segment",
        "timeout_ns", "signature", "call"]
    assert kinds_of(params) == kernels.LAMPORT_ARGS


def test_host_asks_for_exactly_the_lamport_entries_the_source_defines(source):
    names, params = lamport_entries(source)
    assert len(names) == 3 * 3 * 7, sorted(names)  # dtypes x kinds x worlds, p1 only
    asked = set()
    for world in WORLDS:
        ks = kernel_set(world)
        for dtype in kernels.DTYPE_NAMES:
            for code in kernels.QUANT_KIND_NAMES:
                first = ks.fused(algorithms.LAMPORT, dtype, code, 1)
                assert ks.fused(algorithms.LAMPORT, dtype, code | ROW_LAYOUT.fnuz_flag,
                                1) is first
            # the block caps' list: one pack a thread only
            assert ks.every_fused(algorithms.LAMPORT, dtype) == [
                ks.fused(algorithms.LAMPORT, dtype, code, 1) for code in kernels.QUANT_KIND_NAMES]
        asked |= asked_once(ks, names, kinds_of(params), 3 * 3, f"_p1_w{world}")
    assert asked == names


def test_lamport_kernel_pushes_before_it_waits_and_keeps_its_proof(source):
    """The kernel's order: announce the start flag, push every row to every
    rank, take the first row, confirm the peers' flags (arrival and digest)
    before anything is written, norm; the counters advance whatever
    happened.  No barrier of the protocol, and the written proof of why
    none is needed."""
    body = device_function(source, "lamport")
    order = ["announce<W>(epoch)", "push_rows<P, W>(", "rows.take(", "confirm<W>(",
             "norm_rows<T, P, Q>(", "BlockEpoch::commit()", "slots.advance()"]
    assert [body.index(step) for step in order] == sorted(body.index(step) for step in order)
    for barrier in ("start_barrier", "mid_barrier", "exit_barrier", "end_barrier"):
        assert barrier not in body, barrier
    proof = source[:source.index("PYAR_DEVICE void lamport(")]
    proof = proof[proof.rindex("// One-stage with pushed rows"):]
    for fact in ("neither a start barrier", "nor an exit", "the seeds' bug has nothing to read",
                 "c - 2", "stream order", "a disagreeing call writes nothing"):
        assert fact in proof, fact


def test_lamport_region_constants_are_the_kernels():
    header = read("pyar_lamport.h")
    assert re.search(r"constexpr uint32_t kEmptyWord = 0x([0-9a-fA-F]+)u;", header).group(1) \
        == f"{layout.LAMPORT_EMPTY_WORD:x}"
    assert constants(header)["kLamportSlots"] == layout.LAMPORT_SLOTS
    assert "constexpr int kLamportHeaderBytes = kMaxBlocks * 4;" in header


def test_lamport_region_starts_with_zero_counters_and_empty_slots():
    region = np.frombuffer(layout.lamport_region(3, 4096, 256), np.uint32)
    assert region.size == 256 + 2 * 3 * 4096 // 4
    assert (region[:256] == 0).all()
    assert (region[256:] == 0x80000000).all()


def test_packs_per_thread_choices_are_the_instantiated_ones(source):
    instantiated = {}
    for name, _, per_thread in instantiations(source):
        instantiated.setdefault(name, []).append(per_thread)
    for dtype, name in kernels.DTYPE_NAMES.items():
        assert list(ROW_LAYOUT.packs_per_thread_choices(dtype.itemsize)) == instantiated[name]
    assert constants(source)["kMaxRowThreads"] == ROW_LAYOUT.max_row_threads


@pytest.mark.parametrize("hidden, dtype, per_thread, threads", [
    (512, BF16, 1, 64), (2880, BF16, 1, 384), (4096, BF16, 1, 512), (4104, BF16, 1, 576),
    (7168, F16, 1, 896), (8192, BF16, 1, 1024), (8200, BF16, 2, 576), (10240, BF16, 2, 640),
    (16384, BF16, 2, 1024), (2048, F32, 1, 512), (4096, F32, 1, 1024), (7168, F32, 2, 896),
    (16384, F32, 4, 1024), (8, BF16, 1, 64)])
def test_row_launch_gives_each_thread_fixed_packs(hidden, dtype, per_thread, threads):
    """The fewest packs per thread within max_row_threads; threads cover every
    pack of a row, in whole 64-lane warps."""
    got = row_launch(10**6, hidden, dtype.itemsize, ROW_LAYOUT.max_row_threads, 40, 256)
    assert (got.packs_per_thread, got.threads) == (per_thread, threads)
    packs = hidden * dtype.itemsize // 16
    assert got.threads * got.packs_per_thread >= packs
    assert got.threads % ROW_THREAD_QUANTUM == 0
    assert (got.threads - ROW_THREAD_QUANTUM) * got.packs_per_thread < packs


@pytest.mark.parametrize("threads_of_row, cap, blocks", [
    (4096, 40, 40),     # 512 threads: the cap as given
    (8192, 40, 20),     # 1024 threads: one a multiprocessor where two of 512 fit
    (7168, 40, 20),     # 896 threads: still one
    (2880, 40, 40),     # 384 threads: two, as for 512
    (1024, 40, 160),    # 128 threads: eight for every two of 512
    (512, 40, 256),     # 64 threads: 16 per two, then the flag slots' limit
    (8192, 1, 1)])      # never none
def test_row_launch_scales_the_block_cap_to_the_block_size(threads_of_row, cap, blocks):
    got = row_launch(10**6, threads_of_row, 2, ROW_LAYOUT.max_row_threads, cap, 256)
    assert got.blocks == blocks


def test_row_launch_takes_one_block_per_row_at_most():
    assert row_launch(3, 4096, 2, 1024, 40, 256).blocks == 3
    assert row_launch(1, 4096, 2, 1024, 40, 256).blocks == 1


@pytest.mark.parametrize("hidden, dtype, quant, per_thread, threads", [
    (4096, BF16, "fp8_per_token", 2, 256),  # 512 packs: paired
    (7168, BF16, "fp8_per_group", 2, 448),
    (7168, BF16, "mxfp4", 1, 896),          # MXFP4 rows keep the fewest
    (2048, F32, "fp8_per_group", 2, 256),
    (4096, BF16, None, 1, 512),             # plain rows keep the fewest
    (4088, BF16, "fp8_per_token", 1, 512),  # 511 packs
    (16384, BF16, "fp8_per_token", 2, 1024),
    (16384, F32, "fp8_per_group", 4, 1024),
    (16384, F32, "mxfp4", 4, 1024)])
def test_local_kernels_pair_the_packs_of_wide_fp8_rows(hidden, dtype, quant, per_thread,
                                                        threads):
    got = row_kernels().local_launch(10**6, hidden, dtype, quant_code(quant), 264)
    assert (got.packs_per_thread, got.threads) == (per_thread, threads)
    # The cap is the fused kernels' one, in blocks of half the most threads.
    assert got == row_launch(10**6, hidden, dtype.itemsize, ROW_LAYOUT.max_row_threads, 264,
                             10**6, least_per_thread=per_thread)


def test_local_kernels_take_what_row_kernels_pass(source, dev):
    entries = local_entries(source)
    assert sorted(entries) == sorted(
        [f"pyar_add_rmsnorm_{t}_{k}_p{p}" for t, _, p in instantiations(source)
         for k in ("plain", "fp8", "mxfp4")] +
        [f"pyar_quantize_{t}_{k}_p{p}" for t, _, p in instantiations(source)
         for k in ("fp8", "mxfp4")])
    for dtype in kernels.DTYPE_NAMES:
        rows = row_kernels()
        tokens, hidden = 5, 256
        q, s = quant_outputs(dev, "fp8_per_group", tokens, hidden, 64)
        call = row_call(dev, tokens=tokens, hidden=hidden, dtype=dtype, quant="fp8_per_group",
                        group_size=64, quantized=q, scales=s)
        rows.add_rmsnorm(call, None, max_blocks=3)
        rows.quantize(call.out, call.quant, q, s, None, max_blocks=8)
        assert len(rows.module.requests) == 2
        for name, argtypes in rows.module.requests:
            assert name in entries, name
            assert argtypes == kinds_of(entries[name]), name
        suffix = f"{kernels.DTYPE_NAMES[dtype]}_fp8_p1"
        add = rows.module.functions[f"pyar_add_rmsnorm_{suffix}"]
        # 256-wide rows: 32 or 64 packs, one 64-thread block a row; a cap of
        # 3 blocks of 512 threads is 24 such blocks, more than the 5 rows.
        (grid, block, args, _), = add.launches
        assert (grid, block) == (tokens, 64)
        by_name = dict(zip(names_of(entries[add.name]), args))
        assert by_name["x"] == call.x.ptr and by_name["tokens"] == tokens
        assert tuple(by_name[f] for f in ROW_FIELDS) == call.row_args(0, tokens)
        assert by_name["failed"] == 0  # the single-GPU step follows no kernel that can fail
        quantize = rows.module.functions[f"pyar_quantize_{suffix}"]
        (grid, block, args, _), = quantize.launches
        assert (grid, block) == (tokens, 64)
        assert dict(zip(names_of(entries[quantize.name]), args)) == {
            "y": call.out.ptr, "tokens": tokens, "hidden": hidden, "q": q.ptr,
            "scales": s.ptr, "quant": call.quant_code, "group": 64}


def test_local_kernels_launch_nothing_for_zero_tokens(dev):
    rows = row_kernels()
    q, s = quant_outputs(dev, "mxfp4", 0, 256)
    call = row_call(dev, tokens=0, hidden=256, quant="mxfp4", quantized=q, scales=s)
    rows.add_rmsnorm(call, None, 8)
    rows.quantize(dev((0, 256), BF16), call.quant, q, s, None, 8)
    assert rows.module.requests == []


def test_rmsnorm_layout_lists_what_row_layout_reads(source):
    init = re.search(r"pyar_rmsnorm_layout\[(\d+)\] = \{(.*?)\};", source, re.S)
    assert init, "pyar_rmsnorm_layout not found"
    assert re.search(r"const uint64_t pyar_rmsnorm_layout\[", source)  # 8 bytes an entry
    entries = [" ".join(e.split()) for e in init.group(2).split(",")]
    assert int(init.group(1)) == len(entries) == len(LAYOUT_VALUES)
    # pyar::kMaxHidden -> max_hidden, ..., in the order RowLayout reads them.
    snake = [re.sub(r"(?<!^)(?=[A-Z])", "_", re.fullmatch(r"pyar::k(\w+)", e).group(1)).lower()
             for e in entries]
    assert snake == list(LAYOUT_VALUES)

    values = {**constants(read("pyar_protocol.h")), **constants(source)}
    values = [values[e.split("::")[1]] for e in entries]
    assert values == list(LAYOUT_VALUES.values())
    assert len(set(values)) == len(values)  # so that each field's place shows
    # RowLayout reads each field from its place in the global's bytes.
    read_back = row_kernels(RecordingModule(layout=dict(zip(snake, values)))).layout
    assert [getattr(read_back, field) for field in snake] == values
    assert [getattr(ROW_LAYOUT, field) for field in snake] == values


def test_row_args_struct_params_and_initializer_agree(source):
    fields = struct_fields(source, "RowArgs")
    params = row_params(source)
    assert tuple(name for _, name in fields) == ROW_FIELDS
    assert tuple(names_of(params)) == ROW_FIELDS
    # The parameters have the fields' types (namespace aside) ...
    assert [c.replace("pyar::", "") for c, _ in params] == [c for c, _ in fields]
    # ... and are what the host passes.
    assert kinds_of(params) == kernels.ROW_ARGS
    assert kernels.FUSED_ARGS[4:4 + len(ROW_FIELDS)] == kernels.ROW_ARGS
    # Aggregate initialization follows declaration order.
    init = re.search(r"pyar::RowArgs \{(.*?)\}", macro_body(source, "PYAR_ROW_ARGS"))
    assert tuple(e.strip() for e in init.group(1).split(",")) == ROW_FIELDS
    # The quantize kernel fills the fields it has by position.
    _, body = macro(source, "PYAR_QUANTIZE_ENTRY")
    init = re.search(r"pyar::RowArgs\{(.*?)\}", body)
    assert dict(zip(ROW_FIELDS, (e.strip() for e in init.group(1).split(",")))) == {
        "residual": "nullptr", "weight": "nullptr", "residual_out": "nullptr",
        "y": "nullptr", "q": "q", "scales": "scales", "hidden": "hidden", "eps": "0.f",
        "quant": "quant", "group": "group"}


@pytest.mark.parametrize("quant", [None, "fp8_per_token", "fp8_per_group", "mxfp4"])
def test_row_args_by_struct_field(dev, quant):
    tokens, hidden, first = 6, 512, 2
    q, s = quant_outputs(dev, quant, tokens, hidden) if quant else (None, None)
    residual_out = dev((tokens, hidden), BF16)
    call = row_call(dev, tokens=tokens, hidden=hidden, eps=1e-5, quant=quant,
                    residual_out=residual_out, quantized=q, scales=s)
    args = dict(zip(ROW_FIELDS, call.row_args(first, 3)))
    row = hidden * 2
    assert args["residual"] == call.residual.ptr + first * row
    assert args["weight"] == call.weight.ptr  # one row for every token
    assert args["residual_out"] == residual_out.ptr + first * row
    assert args["y"] == call.out.ptr + first * row
    assert (args["hidden"], args["eps"]) == (hidden, 1e-5)
    if quant is None:
        assert (args["q"], args["scales"], args["quant"], args["group"]) == (0, 0, 0, 0)
    else:
        assert args["q"] == q.ptr + first * q.shape[1] * q.itemsize
        assert args["scales"] == s.ptr + first * s.shape[1] * s.itemsize
        assert args["quant"] == call.quant_code
        assert args["group"] == {"fp8_per_token": hidden, "fp8_per_group": 128,
                                 "mxfp4": 32}[quant]


def test_quant_codes_are_the_kernels(source):
    enum = re.search(r"enum QuantKind : uint32_t \{(.*?)\};", source)
    assert enum, "enum QuantKind not found"
    codes = {name.strip(): int(value, 0)
             for name, value in (e.split("=") for e in enum.group(1).split(","))}
    assert codes == {"kNoQuant": 0, "kFp8": 1, "kMxfp4": 2}
    assert {kind: quant_code(kind) for kind in (None, *QUANT_KINDS)} \
        == {None: codes["kNoQuant"], "fp8_per_token": codes["kFp8"],
            "fp8_per_group": codes["kFp8"], "mxfp4": codes["kMxfp4"]}
    # The kernel name's kind is the one instantiated with that code; the
    # FNUZ flag lies above the kind and reaches the kernel in `quant`.
    assert {codes[enumerator]: kind for kind, enumerator in quant_kinds(source).items()} == \
        kernels.QUANT_KIND_NAMES
    assert "a.quant & kFnuzFlag" in source
    assert constants(source)["kFnuzFlag"] & 0xF == 0
    assert max(codes.values()) <= 0xF
