"""allreduce_rmsnorm without a GPU (tier a): the calling convention between
the host (pyar/comm/rmsnorm.py, pyar/comm/communicator.py) and the kernels of
src/kernels/allreduce_rmsnorm.cu, the choice of fused variant, and the
argument checks of ``RowCall`` / ``Quantization``.

How this runs without a GPU:

* The kernel source is parsed (macro continuation lines joined): the entry
  names and parameter lists the macros define, ``struct RowArgs``, the
  ``pyar_rmsnorm_layout`` initializer and the ``QuantKind`` codes.
* The host asks a ``_RecordingModule`` for its kernels; its functions record
  ``launch`` calls and check the arguments the way ``pyar._hip.Function``
  packs them (count, integer kinds in range, float for float32).
* Arrays are ``pyar.DeviceArray.from_pointer(address, shape, dtype,
  device=0)`` on made-up, 16-byte-aligned, non-overlapping addresses: the
  constructor makes no GPU call when ``device`` is given, and the checks only
  read ``ptr``, ``shape``, ``dtype``, ``device`` and ``readonly``.  Nothing is
  dereferenced.  Every test passes explicit outputs, because a missing output
  is allocated with ``pyar.empty`` (a GPU call).
* The layout the checks read from a loaded module is a plain namespace with
  the values of the kernel constants (``LAYOUT``); a test checks those against
  the source and ``RowLayout`` against the initializer's bytes.
* ``fp8_dtype`` is given explicitly except where ``rmsnorm.default_fp8_dtype``
  (or the ``_hip.Device`` query behind it) is monkeypatched.
* ``Communicator`` methods are exercised on an instance made with
  ``__new__`` plus the attributes they read, as tests/test_comm_cpu.py does;
  ``memcpy_dtod`` (the staging copy) is monkeypatched to record.

Not covered here: ``allreduce_rmsnorm`` on a closed communicator.  A real
``Communicator`` cannot be constructed without a GPU (``_select_device``
calls hipGetDeviceCount, which raises hipErrorNoDevice), so that check lives
with the GPU tests.
"""
import math
import operator
import os
import re
import struct
import types

import ml_dtypes
import numpy as np
import pytest

pytest.importorskip("mpi4py")  # pyar.comm initializes MPI (a singleton here)

import pyar  # noqa: E402
from pyar.comm import algorithms, communicator, layout, rmsnorm  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNELS = os.path.join(ROOT, "src", "kernels")

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
E4M3FN = np.dtype(ml_dtypes.float8_e4m3fn)
E4M3FNUZ = np.dtype(ml_dtypes.float8_e4m3fnuz)
U8 = np.dtype(np.uint8)

# The fields of struct RowArgs, in the order the kernels declare them.
ROW_FIELDS = ("residual", "weight", "residual_out", "y", "q", "scales", "hidden", "eps",
              "quant", "group")

# What RowLayout would read from a loaded module (checked against the source below).
LAYOUT = rmsnorm.RowLayout.__new__(rmsnorm.RowLayout)
LAYOUT.__dict__.update(max_hidden=16384, max_row_threads=1024, mx_block=32, fnuz_flag=0x10)
# The all-reduce kernels' layout fields the fused launch reads.
KERNEL_THREADS, KERNEL_MAX_BLOCKS = 512, 256


# --- parsing the kernel source ---------------------------------------------------

def _read(name):
    with open(os.path.join(KERNELS, name)) as f:
        return f.read()


@pytest.fixture(scope="module")
def source():
    """allreduce_rmsnorm.cu with macro continuation lines joined."""
    return re.sub(r"\\\n", " ", _read("allreduce_rmsnorm.cu"))


def _macro(source, name):
    """(parameter names, body) of ``#define name(...) body``."""
    m = re.search(r"^#define %s\(([^)]*)\)(.*)$" % name, source, re.M)
    assert m, f"macro {name} not found in allreduce_rmsnorm.cu"
    return [p.strip() for p in m.group(1).split(",")], " ".join(m.group(2).split())


def _macro_body(source, name):
    m = re.search(r"^#define %s[ \t](.*)$" % name, source, re.M)
    assert m, f"macro {name} not found in allreduce_rmsnorm.cu"
    return " ".join(m.group(1).split())


def _paste(template, **values):
    """``a##b##c`` with the macro parameters among the pieces substituted."""
    return "".join(values.get(piece.strip(), piece.strip()) for piece in template.split("##"))


def _kind(ctype):
    """The pyar._hip argument kind a C parameter type is passed as."""
    if ctype.endswith("*"):
        return "ptr"
    return {"uint64_t": "uint64", "uint32_t": "uint32", "float": "float32"}[ctype]


def _parameters(text):
    """[(C type, name)] of a parameter list such as ``const T *a, uint32_t n``."""
    params = []
    for p in text.split(","):
        m = re.fullmatch(r"(.*?)\s*(\w+)", " ".join(p.split()))
        assert m, f"cannot parse parameter {p!r}"
        ctype = re.sub(r"\s*\*", " *", m.group(1)).strip()
        params.append((ctype, m.group(2)))
    return params


def _row_params(source):
    return _parameters(_macro_body(source, "PYAR_ROW_PARAMS"))


def _with_row_params(source, text):
    return text.replace("PYAR_ROW_PARAMS", _macro_body(source, "PYAR_ROW_PARAMS"))


def _instantiations(source):
    """The top-level ``PYAR_ROW_KINDS(name, T, P)`` lines: [(name, T, P)]."""
    found = [(n, t, int(p)) for n, t, p in
             re.findall(r"^PYAR_ROW_KINDS\((\w+), ([\w:]+), (\d+)\)", source, re.M)]
    assert found, "no PYAR_ROW_KINDS instantiation found"
    return found


def _dtype_names(source):
    """{dtype name: C type} of the instantiations."""
    return {name: t for name, t, _ in _instantiations(source)}


def _kinds(source):
    """{quant kind name: QuantKind enumerator} that PYAR_ROW_KINDS instantiates."""
    args, body = _macro(source, "PYAR_ROW_KINDS")
    assert args == ["name", "T", "P"], args
    return dict(re.findall(r"PYAR_ROW_KERNELS\(name, T, (\w+), pyar::(\w+), P\)", body))


_BOUNDS = r"void __launch_bounds__\(pyar::kMaxRowThreads\) "


def _fused_entries(source):
    """(every fused entry name the macros define, its [(C type, name)])."""
    args, body = _macro(source, "PYAR_FUSED_ENTRY")
    assert args == ["algo", "name", "T", "kind", "Q", "P", "W"], args
    m = re.search(_BOUNDS + r"([\w#]+)\((.*?)\) \{", body)
    assert m, body
    template, params = m.group(1), _parameters(_with_row_params(source, m.group(2)))
    _, worlds_body = _macro(source, "PYAR_FUSED_WORLDS")
    worlds = re.findall(r"PYAR_FUSED_ENTRY\(algo, name, T, kind, Q, P, (\d+)\)", worlds_body)
    _, kernels_body = _macro(source, "PYAR_ROW_KERNELS")
    algos = re.findall(r"PYAR_FUSED_WORLDS\((\w+), name, T, kind, Q, P\)", kernels_body)
    names = {_paste(template, algo=a, name=t, kind=k, P=str(p), W=w)
             for a in algos for t, _, p in _instantiations(source) for k in _kinds(source)
             for w in worlds}
    return names, params


def _split_entries(source):
    """(every split first-kernel name the macros define, its [(C type, name)])."""
    args, body = _macro(source, "PYAR_SPLIT_ENTRY")
    assert args == ["name", "T", "P", "W"], args
    m = re.search(r"void PYAR_SPLIT_BOUNDS ([\w#]+)\((.*?)\) \{", body)
    assert m, body
    template, params = m.group(1), _parameters(m.group(2))
    args, worlds_body = _macro(source, "PYAR_EACH_WORLD")
    assert args == ["M", "..."], args
    worlds = re.findall(r"M\(__VA_ARGS__, (\d+)\)", worlds_body)
    _, kinds_body = _macro(source, "PYAR_ROW_KINDS")
    # once per (dtype, P)
    assert "PYAR_EACH_WORLD(PYAR_SPLIT_ENTRY, name, T, P)" in kinds_body
    names = {_paste(template, name=t, P=str(p), W=w)
             for t, _, p in _instantiations(source) for w in worlds}
    return names, params


def _local_entries(source):
    """{kernel name: [(C type, name)]} of the single-GPU kernels."""
    entries = {}
    for macro, kinds in (("PYAR_LOCAL_ENTRIES", _kinds(source)), ("PYAR_QUANTIZE_ENTRY",
                                                                  ("fp8", "mxfp4"))):
        args, body = _macro(source, macro)
        assert args == ["name", "T", "kind", "Q", "P"], args
        (template, params), = re.findall(_BOUNDS + r"([\w#]+)\((.*?)\) \{", body)
        for t, _, p in _instantiations(source):
            for kind in kinds:
                entries[_paste(template, name=t, kind=kind, P=str(p))] = _parameters(
                    _with_row_params(source, params))
    _, kinds_body = _macro(source, "PYAR_ROW_KINDS")
    assert re.findall(r"PYAR_QUANTIZE_ENTRY\(name, T, (\w+), pyar::\w+, P\)", kinds_body) == [
        "fp8", "mxfp4"]
    return entries


def _struct_fields(source, name):
    body = re.search(r"struct %s \{(.*?)\n\};" % name, source, re.S)
    assert body, f"struct {name} not found"
    fields = []
    for line in body.group(1).splitlines():
        code = line.split("//")[0].strip()
        if code:
            fields.extend(_parameters(code.rstrip(";")))
    return fields


def _constants(text):
    return {name: int(value, 0)
            for name, value in re.findall(r"constexpr \w+ (k\w+) = (0x[0-9a-fA-F]+|\d+);", text)}


# --- recording stand-ins for a loaded module ---------------------------------------

_RANGES = {"uint32": 1 << 32, "uint64": 1 << 64, "ptr": 1 << 64}


class _RecordingFunction:
    def __init__(self, name, argtypes):
        self.name, self.argtypes, self.launches = name, tuple(argtypes), []

    def launch(self, grid, block, args=(), shared_mem=0, stream=None):
        # What pyar._hip.Function.launch would refuse.
        assert len(args) == len(self.argtypes), (self.name, args)
        for kind, value in zip(self.argtypes, args):
            if kind == "float32":
                assert isinstance(value, float), (self.name, kind, value)
            else:
                assert not isinstance(value, (bool, float)), (self.name, kind, value)
                assert 0 <= operator.index(value) < _RANGES[kind], (self.name, kind, value)
        self.launches.append((grid, block, tuple(args), stream))


class _RecordingModule:
    """Stands in for a loaded code object: records the kernels asked for."""

    def __init__(self):
        self.requests = []
        self.functions = {}

    def get_function(self, name, argtypes=()):
        self.requests.append((name, tuple(argtypes)))
        function = self.functions[name] = _RecordingFunction(name, argtypes)
        return function


def _row_kernels():
    """RowKernels over a _RecordingModule (no RowLayout read from a GPU)."""
    kernels = rmsnorm.RowKernels.__new__(rmsnorm.RowKernels)
    kernels.module = _RecordingModule()
    kernels.layout = LAYOUT
    kernels._functions = {}
    return kernels


# --- fake device arrays -------------------------------------------------------------

class _Addresses:
    """Made-up device addresses: 4 KiB aligned, a 4 KiB gap between arrays."""

    def __init__(self):
        self.next = 0x7F00_0000_0000

    def take(self, nbytes):
        ptr = self.next
        self.next += (nbytes + 0x1FFF) // 0x1000 * 0x1000
        return ptr


@pytest.fixture
def dev():
    addresses = _Addresses()

    def make(shape, dtype, *, at=None, device=0, readonly=False):
        dtype = np.dtype(dtype)
        ptr = addresses.take(math.prod(shape) * dtype.itemsize) if at is None else at
        return pyar.DeviceArray.from_pointer(ptr, shape, dtype, device=device,
                                             readonly=readonly)
    return make


def test_fake_arrays_make_no_gpu_call(dev):
    # The premise of this file: the checks read these attributes and nothing else.
    a = dev((4, 2880), BF16)
    assert (a.shape, a.dtype, a.device, a.readonly, a.nbytes) == ((4, 2880), BF16, 0, False,
                                                                  4 * 2880 * 2)
    assert a.ptr % rmsnorm.PACK_BYTES == 0 and isinstance(a, pyar.DeviceArray)


def _call(dev, *, tokens=4, hidden=2880, dtype=BF16, x=None, residual=None, weight=None,
          eps=1e-6, out="new", residual_out=None, quant=None, group_size=128,
          fp8_dtype=E4M3FN, quantized=None, scales=None, device=0):
    """A RowCall with every array given explicitly ("new": a fresh array)."""
    x = dev((tokens, hidden), dtype) if x is None else x
    residual = dev(x.shape, x.dtype) if residual is None else residual
    weight = dev((x.shape[-1],), x.dtype) if weight is None else weight
    if isinstance(out, str):
        out = dev(x.shape, x.dtype)
    return rmsnorm.RowCall(x, residual, weight, eps, out, residual_out, quant, group_size,
                           fp8_dtype, quantized, scales, None, device, LAYOUT)


def _quant_outputs(dev, quant, tokens, hidden, group_size=128, fp8_dtype=E4M3FN):
    """Correctly shaped (quantized, scales) for ``quant``."""
    if quant == "mxfp4":
        return dev((tokens, hidden // 2), U8), dev((tokens, hidden // 32), U8)
    group = hidden if quant == "fp8_per_token" else group_size
    return dev((tokens, hidden), fp8_dtype), dev((tokens, hidden // group), F32)


# --- 1. the kernel/host calling convention --------------------------------------------

def _asked_once(comm, names, kinds, count, suffix):
    """The kernels ``comm`` asked its module for: ``count`` of them, each once,
    each among ``names``, ending in ``suffix`` and taking ``kinds``."""
    requests = comm._row_kernels.module.requests
    assert len(requests) == count, requests
    for name, argtypes in requests:
        assert name in names and name.endswith(suffix), name
        assert argtypes == kinds, (name, argtypes)
    return {name for name, _ in requests}


def test_kernel_dtype_names_are_the_hosts(source):
    """The f32/f16/bf16 suffixes instantiate the C types the host's dtypes mean."""
    c_type = {"float": F32, "__half": F16, "pyar::bf16_bits": BF16}
    assert {name: c_type[t] for name, t in _dtype_names(source).items()} == {
        name: dtype for dtype, name in rmsnorm.DTYPES.items()}
    assert rmsnorm.DTYPES == communicator._KERNEL_TYPES


def test_fused_entry_parameters_are_the_fused_types(source):
    _, params = _fused_entries(source)
    assert [name for _, name in params] == [
        "in", "in_offset", "stage_from", "tokens", *ROW_FIELDS, "state", "timeout_ns",
        "signature", "call"]
    assert tuple(_kind(ctype) for ctype, _ in params) == rmsnorm.FUSED_TYPES


def test_host_asks_for_exactly_the_fused_entries_the_source_defines(source):
    names, params = _fused_entries(source)
    # 2 variants x 3 kinds x (p1, p2, p4 float32; p1, p2 16-bit) x 7 worlds
    assert len(names) == 2 * 3 * 7 * 7, sorted(names)
    kinds = tuple(_kind(ctype) for ctype, _ in params)
    asked = set()
    for world in range(2, 9):
        comm = communicator.Communicator.__new__(communicator.Communicator)
        comm.world = world
        comm._functions = {}
        comm._row_kernels = _row_kernels()
        for variant in algorithms.FUSED_VARIANTS:
            for dtype in communicator._KERNEL_TYPES:
                for per_thread in LAYOUT.packs_per_thread_choices(dtype.itemsize):
                    for code in rmsnorm.KERNEL_KINDS:
                        first = comm._fused_function(variant, dtype, code, per_thread)
                        # cached; the FNUZ flag selects no other kernel
                        assert comm._fused_function(variant, dtype, code | LAYOUT.fnuz_flag,
                                                    per_thread) is first
        asked |= _asked_once(comm, names, kinds, 2 * 3 * 7, f"_w{world}")
    assert asked == names


def test_split_entry_parameters_are_the_split_types(source):
    _, params = _split_entries(source)
    assert [name for _, name in params] == [
        "in", "in_offset", "stage_from", "tokens", "hidden", "state", "timeout_ns", "signature",
        "call"]
    assert tuple(_kind(ctype) for ctype, _ in params) == rmsnorm.SPLIT_TYPES


def test_host_asks_for_exactly_the_split_entries_the_source_defines(source):
    """Split's first kernel: one per (dtype, packs per thread, world), the
    same for every quantization kind (the second kernel, add_rmsnorm, has it)."""
    names, params = _split_entries(source)
    assert len(names) == 7 * 7, sorted(names)  # (p1, p2, p4 float32; p1, p2 16-bit) x 7
    kinds = tuple(_kind(ctype) for ctype, _ in params)
    asked = set()
    for world in range(2, 9):
        comm = _comm(world)
        for dtype in communicator._KERNEL_TYPES:
            for per_thread in LAYOUT.packs_per_thread_choices(dtype.itemsize):
                first = comm._fused_function(algorithms.SPLIT, dtype, 0, per_thread)
                for code in rmsnorm.KERNEL_KINDS:
                    assert comm._fused_function(algorithms.SPLIT, dtype, code, per_thread) \
                        is first
                    assert comm._fused_function(algorithms.SPLIT, dtype,
                                                code | LAYOUT.fnuz_flag, per_thread) is first
        asked |= _asked_once(comm, names, kinds, 7, f"_w{world}")
    assert asked == names


def test_split_first_kernel_is_two_stage_cut_at_mid(source):
    """Kernel A runs two-stage's phase 1 (the same reduce_scatter_rows, so
    the same sums) and its `mid` barrier through mid_barrier (the control
    build's PYAR_TEST_SKIP_MID_BARRIER removes it), then returns: no rows
    normed, no exit barrier, and the written proof of why none is needed."""
    body = re.search(r"PYAR_DEVICE void split_reduce\(.*?\n\}\n", source, re.S).group(0)
    assert "reduce_scatter_rows<T, P, W>(src, gather, tokens" in body
    assert body.index("reduce_scatter_rows") < body.index("fence_system()") < body.index(
        "mid_barrier<W>(s, epoch, info)")
    assert "norm_rows" not in body and "exit_barrier" not in body
    proof = source[:source.index("PYAR_DEVICE void split_reduce(")]
    proof = proof[proof.rindex("// Kernel A of split"):]
    for fact in ("No exit barrier (rule 1)", "before `mid`", "stream order",
                 "only p's own memory"):
        assert fact in proof, fact
    two_stage = re.search(r"PYAR_DEVICE void two_stage\(.*?\n\}\n", source, re.S).group(0)
    assert "mid_barrier<W>(s, epoch, info)" in two_stage


def _lamport_entries(source):
    """(every lamport entry name the macros define, its [(C type, name)]):
    one pack per thread only (PYAR_LAMPORT_P1), every world."""
    args, body = _macro(source, "PYAR_LAMPORT_ENTRY")
    assert args == ["name", "T", "kind", "Q", "W"], args
    m = re.search(_BOUNDS + r"([\w#]+)\((.*?)\) \{", body)
    assert m, body
    template, params = m.group(1), _parameters(_with_row_params(source, m.group(2)))
    assert _macro(source, "PYAR_LAMPORT_P1")[1] == (
        "PYAR_EACH_WORLD(PYAR_LAMPORT_ENTRY, name, T, kind, Q)")
    assert _macro(source, "PYAR_LAMPORT_P2")[1] == _macro(source, "PYAR_LAMPORT_P4")[1] == ""
    assert "PYAR_LAMPORT_P##P(name, T, kind, Q)" in _macro(source, "PYAR_ROW_KERNELS")[1]
    worlds = re.findall(r"M\(__VA_ARGS__, (\d+)\)", _macro(source, "PYAR_EACH_WORLD")[1])
    names = {_paste(template, name=t, kind=k, W=w)
             for t, _, p in _instantiations(source) if p == 1 for k in _kinds(source)
             for w in worlds}
    return names, params


def test_lamport_entry_parameters_are_the_lamport_types(source):
    _, params = _lamport_entries(source)
    assert [name for _, name in params] == [
        "x", "tokens", *ROW_FIELDS, "state", "region", "region_offset", "segment",
        "timeout_ns", "signature", "call"]
    assert tuple(_kind(ctype) for ctype, _ in params) == rmsnorm.LAMPORT_TYPES


def test_host_asks_for_exactly_the_lamport_entries_the_source_defines(source):
    names, params = _lamport_entries(source)
    assert len(names) == 3 * 3 * 7, sorted(names)  # dtypes x kinds x worlds, p1 only
    kinds = tuple(_kind(ctype) for ctype, _ in params)
    asked = set()
    for world in range(2, 9):
        comm = _comm(world)
        for dtype in communicator._KERNEL_TYPES:
            for code in rmsnorm.KERNEL_KINDS:
                first = comm._fused_function(algorithms.LAMPORT, dtype, code, 1)
                assert comm._fused_function(algorithms.LAMPORT, dtype, code | LAYOUT.fnuz_flag,
                                            1) is first
        asked |= _asked_once(comm, names, kinds, 3 * 3, f"_p1_w{world}")
    assert asked == names


def test_lamport_kernel_pushes_before_it_waits_and_keeps_its_proof(source):
    """The kernel's order: announce the start flag, push every row to every
    rank, take the first row, confirm the peers' flags (arrival and digest)
    before anything is written, norm; the counters advance whatever
    happened.  No barrier of the protocol, and the written proof of why
    none is needed."""
    body = re.search(r"PYAR_DEVICE void lamport\(.*?\n\}\n", source, re.S).group(0)
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


def test_lamport_region_constants_are_the_kernels(source):
    header = _read("pyar_lamport.h")
    assert re.search(r"constexpr uint32_t kEmptyWord = 0x([0-9a-fA-F]+)u;", header).group(1) \
        == f"{layout.LAMPORT_EMPTY_WORD:x}"
    assert _constants(header)["kLamportSlots"] == layout.LAMPORT_SLOTS
    assert "constexpr int kLamportHeaderBytes = kMaxBlocks * 4;" in header


def test_lamport_region_starts_with_zero_counters_and_empty_slots():
    region = np.frombuffer(layout.lamport_region(3, 4096, 256), np.uint32)
    assert region.size == 256 + 2 * 3 * 4096 // 4
    assert (region[:256] == 0).all()
    assert (region[256:] == 0x80000000).all()


def test_lamport_step_passes_its_arguments_by_parameter_name(source, dev):
    """One launch for the whole input, this rank's own x (no staging, no
    table), the receive region past the two-shot scratch, and a segment of
    the slot in packs."""
    _, params = _lamport_entries(source)
    names = [n for _, n in params]
    comm = _comm(world=4)
    tokens, hidden = 24, 4096
    q, s = _quant_outputs(dev, "fp8_per_group", tokens, hidden)
    call = _call(dev, tokens=tokens, hidden=hidden, quant="fp8_per_group", quantized=q, scales=s)
    steps = list(comm._rmsnorm_steps(call, algorithms.LAMPORT, None))
    assert len(steps) == 1
    comm._run_step(steps[0], "S")
    function = comm._row_kernels.module.functions["pyar_allreduce_rmsnorm_lamport_bf16_fp8_p1_w4"]
    (grid, block, args, stream), = function.launches
    got = dict(zip(names, args))
    assert (grid, block, stream) == (tokens, 512, "S")  # one 512-thread block a row of 4096
    assert tuple(got[f] for f in ROW_FIELDS) == call.row_args(0, tokens)
    assert got["x"] == call.x.ptr and got["tokens"] == tokens
    assert got["region"] == comm._buffer.ptr + comm._lamport_offset
    assert got["region_offset"] == comm._lamport_offset - comm._partial_offset == comm.max_size
    assert got["segment"] == (1 << 20) // 16
    assert got["signature"] == layout.signature("lamport", tokens * hidden, call.x.dtype, False,
                                                call.quant_code & 0xF)
    assert got["call"] == 0 and got["state"] == comm._state.ptr


def test_packs_per_thread_choices_are_the_instantiated_ones(source):
    instantiated = {}
    for name, _, per_thread in _instantiations(source):
        instantiated.setdefault(name, []).append(per_thread)
    for dtype, name in rmsnorm.DTYPES.items():
        assert list(LAYOUT.packs_per_thread_choices(dtype.itemsize)) == instantiated[name]
    assert _constants(source)["kMaxRowThreads"] == LAYOUT.max_row_threads


@pytest.mark.parametrize("hidden, dtype, per_thread, threads", [
    (512, BF16, 1, 64), (2880, BF16, 1, 384), (4096, BF16, 1, 512), (4104, BF16, 1, 576),
    (7168, F16, 1, 896), (8192, BF16, 1, 1024), (8200, BF16, 2, 576), (10240, BF16, 2, 640),
    (16384, BF16, 2, 1024), (2048, F32, 1, 512), (4096, F32, 1, 1024), (7168, F32, 2, 896),
    (16384, F32, 4, 1024), (8, BF16, 1, 64)])
def test_row_launch_gives_each_thread_fixed_packs(hidden, dtype, per_thread, threads):
    """The fewest packs per thread within max_row_threads; threads cover every
    pack of a row, in whole 64-lane warps."""
    got = rmsnorm.row_launch(10**6, hidden, dtype.itemsize, LAYOUT.max_row_threads, 40, 256)
    assert (got.packs_per_thread, got.threads) == (per_thread, threads)
    packs = hidden * dtype.itemsize // 16
    assert got.threads * got.packs_per_thread >= packs
    assert got.threads % rmsnorm.ROW_THREAD_QUANTUM == 0
    assert (got.threads - rmsnorm.ROW_THREAD_QUANTUM) * got.packs_per_thread < packs


@pytest.mark.parametrize("threads_of_row, cap, blocks", [
    (4096, 40, 40),     # 512 threads: the cap as given
    (8192, 40, 20),     # 1024 threads: one a multiprocessor where two of 512 fit
    (7168, 40, 20),     # 896 threads: still one
    (2880, 40, 40),     # 384 threads: two, as for 512
    (1024, 40, 160),    # 128 threads: eight for every two of 512
    (512, 40, 256),     # 64 threads: 16 per two, then the flag slots' limit
    (8192, 1, 1)])      # never none
def test_row_launch_scales_the_block_cap_to_the_block_size(threads_of_row, cap, blocks):
    got = rmsnorm.row_launch(10**6, threads_of_row, 2, LAYOUT.max_row_threads, cap, 256)
    assert got.blocks == blocks


def test_row_launch_takes_one_block_per_row_at_most():
    assert rmsnorm.row_launch(3, 4096, 2, 1024, 40, 256).blocks == 3
    assert rmsnorm.row_launch(1, 4096, 2, 1024, 40, 256).blocks == 1


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
    got = _row_kernels().local_launch(10**6, hidden, dtype, rmsnorm.quant_code(quant), 264)
    assert (got.packs_per_thread, got.threads) == (per_thread, threads)
    # The cap is the fused kernels' one, in blocks of half the most threads.
    assert got == rmsnorm.row_launch(10**6, hidden, dtype.itemsize, LAYOUT.max_row_threads, 264,
                                     10**6, least_per_thread=per_thread)


def test_local_kernels_take_what_row_kernels_pass(source, dev):
    entries = _local_entries(source)
    assert sorted(entries) == sorted(
        [f"pyar_add_rmsnorm_{t}_{k}_p{p}" for t, _, p in _instantiations(source)
         for k in ("plain", "fp8", "mxfp4")] +
        [f"pyar_quantize_{t}_{k}_p{p}" for t, _, p in _instantiations(source)
         for k in ("fp8", "mxfp4")])
    for dtype in rmsnorm.DTYPES:
        kernels = _row_kernels()
        tokens, hidden = 5, 256
        q, s = _quant_outputs(dev, "fp8_per_group", tokens, hidden, 64)
        call = _call(dev, tokens=tokens, hidden=hidden, dtype=dtype, quant="fp8_per_group",
                     group_size=64, quantized=q, scales=s)
        kernels.add_rmsnorm(call, None, max_blocks=3)
        kernels.quantize(call.out, call.quant, q, s, None, max_blocks=8)
        assert len(kernels.module.requests) == 2
        for name, argtypes in kernels.module.requests:
            assert name in entries, name
            assert argtypes == tuple(_kind(c) for c, _ in entries[name]), name
        suffix = f"{rmsnorm.DTYPES[dtype]}_fp8_p1"
        add = kernels.module.functions[f"pyar_add_rmsnorm_{suffix}"]
        # 256-wide rows: 32 or 64 packs, one 64-thread block a row; a cap of
        # 3 blocks of 512 threads is 24 such blocks, more than the 5 rows.
        (grid, block, args, _), = add.launches
        assert (grid, block) == (tokens, 64)
        by_name = dict(zip((n for _, n in entries[add.name]), args))
        assert by_name["x"] == call.x.ptr and by_name["tokens"] == tokens
        assert tuple(by_name[f] for f in ROW_FIELDS) == call.row_args(0, tokens)
        assert by_name["failed"] == 0  # the single-GPU step follows no kernel that can fail
        quantize = kernels.module.functions[f"pyar_quantize_{suffix}"]
        (grid, block, args, _), = quantize.launches
        assert (grid, block) == (tokens, 64)
        assert dict(zip((n for _, n in entries[quantize.name]), args)) == {
            "y": call.out.ptr, "tokens": tokens, "hidden": hidden, "q": q.ptr,
            "scales": s.ptr, "quant": call.quant_code, "group": 64}


def test_local_kernels_launch_nothing_for_zero_tokens(dev):
    kernels = _row_kernels()
    q, s = _quant_outputs(dev, "mxfp4", 0, 256)
    call = _call(dev, tokens=0, hidden=256, quant="mxfp4", quantized=q, scales=s)
    kernels.add_rmsnorm(call, None, 8)
    kernels.quantize(dev((0, 256), BF16), call.quant, q, s, None, 8)
    assert kernels.module.requests == []


def test_rmsnorm_layout_lists_what_row_layout_reads(source, monkeypatch):
    init = re.search(r"pyar_rmsnorm_layout\[(\d+)\] = \{(.*?)\};", source, re.S)
    assert init, "pyar_rmsnorm_layout not found"
    assert re.search(r"const uint64_t pyar_rmsnorm_layout\[", source)  # 8 bytes an entry
    entries = [" ".join(e.split()) for e in init.group(2).split(",")]
    assert int(init.group(1)) == len(entries) == len(rmsnorm.RowLayout._FIELDS)
    # pyar::kMaxHidden -> max_hidden, ..., in RowLayout's order.
    snake = [re.sub(r"(?<!^)(?=[A-Z])", "_", re.fullmatch(r"pyar::k(\w+)", e).group(1)).lower()
             for e in entries]
    assert tuple(snake) == rmsnorm.RowLayout._FIELDS

    constants = {**_constants(_read("pyar_protocol.h")), **_constants(source)}
    values = [constants[e.split("::")[1]] for e in entries]
    assert values == [getattr(LAYOUT, f) for f in rmsnorm.RowLayout._FIELDS]

    class Module:
        def get_global(self, name):
            assert name == "pyar_rmsnorm_layout"
            return 0xABC000, 8 * len(values)

    def memcpy_dtoh(dst, src):
        assert src == 0xABC000
        dst[:] = struct.pack(f"<{len(values)}Q", *values)

    monkeypatch.setattr(rmsnorm._hip, "memcpy_dtoh", memcpy_dtoh)
    read = rmsnorm.RowLayout(Module())
    assert [getattr(read, f) for f in rmsnorm.RowLayout._FIELDS] == values


def test_row_args_struct_params_and_initializer_agree(source):
    fields = _struct_fields(source, "RowArgs")
    params = _row_params(source)
    assert tuple(name for _, name in fields) == ROW_FIELDS
    assert tuple(name for _, name in params) == ROW_FIELDS
    # The parameters have the fields' types (namespace aside) ...
    assert [c.replace("pyar::", "") for c, _ in params] == [c for c, _ in fields]
    # ... and are what the host passes.
    assert tuple(_kind(c) for c, _ in params) == rmsnorm._ROW_TYPES
    assert rmsnorm.FUSED_TYPES[4:4 + len(ROW_FIELDS)] == rmsnorm._ROW_TYPES
    # Aggregate initialization follows declaration order.
    init = re.search(r"pyar::RowArgs \{(.*?)\}", _macro_body(source, "PYAR_ROW_ARGS"))
    assert tuple(e.strip() for e in init.group(1).split(",")) == ROW_FIELDS
    # The quantize kernel fills the fields it has by position.
    _, body = _macro(source, "PYAR_QUANTIZE_ENTRY")
    init = re.search(r"pyar::RowArgs\{(.*?)\}", body)
    assert dict(zip(ROW_FIELDS, (e.strip() for e in init.group(1).split(",")))) == {
        "residual": "nullptr", "weight": "nullptr", "residual_out": "nullptr",
        "y": "nullptr", "q": "q", "scales": "scales", "hidden": "hidden", "eps": "0.f",
        "quant": "quant", "group": "group"}


@pytest.mark.parametrize("quant", [None, "fp8_per_token", "fp8_per_group", "mxfp4"])
def test_row_args_by_struct_field(dev, quant):
    tokens, hidden, first = 6, 512, 2
    q, s = _quant_outputs(dev, quant, tokens, hidden) if quant else (None, None)
    residual_out = dev((tokens, hidden), BF16)
    call = _call(dev, tokens=tokens, hidden=hidden, eps=1e-5, quant=quant,
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
    assert rmsnorm._KIND_CODE == {None: codes["kNoQuant"], "fp8_per_token": codes["kFp8"],
                                  "fp8_per_group": codes["kFp8"], "mxfp4": codes["kMxfp4"]}
    # The kernel name's kind is the one instantiated with that code; the
    # FNUZ flag lies above the kind and reaches the kernel in `quant`.
    assert {codes[enumerator]: kind for kind, enumerator in _kinds(source).items()} == \
        rmsnorm.KERNEL_KINDS
    assert "a.quant & kFnuzFlag" in source
    assert _constants(source)["kFnuzFlag"] & 0xF == 0
    assert max(codes.values()) <= 0xF


# The variants whose kernels spin on peers (a block cap each).
SPINNING = algorithms.FUSED_VARIANTS + (algorithms.SPLIT, algorithms.LAMPORT)


@pytest.fixture
def without_lamport(monkeypatch):
    """The tables of the barrier-bound variants alone: "auto" never picks
    lamport (its own tests below)."""
    monkeypatch.setattr(algorithms, "LAMPORT_MAX_BYTES", dict.fromkeys(range(2, 9), 0))


def _comm(world, max_size=1 << 20):
    """A Communicator with just what _prepare_rmsnorm/_launch_rmsnorm read."""
    comm = communicator.Communicator.__new__(communicator.Communicator)
    comm.world, comm.rank, comm.device, comm.max_size = world, 0, 0, max_size
    comm._functions, comm._calls, comm._call_log = {}, 0, {}
    comm._row_kernels = _row_kernels()
    comm._layout = types.SimpleNamespace(threads=KERNEL_THREADS, max_blocks=KERNEL_MAX_BLOCKS,
                                         failed_offset=0xa300)
    comm._max_fused_blocks = {(variant, dtype): 40 for variant in SPINNING
                              for dtype in communicator._KERNEL_TYPES}
    comm._buffer = types.SimpleNamespace(ptr=0x5000_0000_0000)
    comm._scratch_offset = 0x1000
    comm._partial_offset = 0x1000 + max_size
    comm._lamport_offset = comm._partial_offset + max_size
    comm._lamport_bytes = min(algorithms.LAMPORT_SEGMENT_BYTES, max_size)
    comm._local_blocks = lambda: 264  # 132 multiprocessors, two blocks each
    comm._staged_table = types.SimpleNamespace(ptr=0x5100_0000_0000)
    comm._state = types.SimpleNamespace(ptr=0x5200_0000_0000)
    comm._timeout_ns = 300 * 10**9
    comm._registry = types.SimpleNamespace(lookup=lambda ptr, nbytes: None)
    comm._node = types.SimpleNamespace(failure=None)  # no host step has failed
    comm._shared_gpu = False
    return comm


@pytest.mark.parametrize("registered", [None, 0x5300_0000_0000])
def test_launch_rmsnorm_passes_each_chunk_by_parameter_name(source, dev, monkeypatch,
                                                            registered):
    _, params = _fused_entries(source)
    names = [n for _, n in params]
    tokens, hidden = 10, 1024
    row = hidden * 2
    comm = _comm(world=4, max_size=4 * row)  # 4 rows a chunk: 4 + 4 + 2
    copies = []
    monkeypatch.setattr(communicator._hip, "memcpy_dtod",
                        lambda dst, src, n, stream=None: copies.append((dst, src, n)))
    q, s = _quant_outputs(dev, "fp8_per_token", tokens, hidden)
    call = _call(dev, tokens=tokens, hidden=hidden, quant="fp8_per_token", quantized=q,
                 scales=s, out=None)
    comm._launch_rmsnorm(call, "twostage", registered, stream=None)
    function = comm._row_kernels.module.functions[
        "pyar_allreduce_rmsnorm_two_stage_bf16_fp8_p1_w4"]
    assert len(function.launches) == 3
    firsts = [0, 4, 8]
    for number, (first, (grid, block, args, _)) in enumerate(zip(firsts, function.launches)):
        count = min(4, tokens - first)
        got = dict(zip(names, args))
        assert (grid, block) == (count, 128)  # a block of 128 threads for each row of 1024
        assert got["tokens"] == count
        assert tuple(got[f] for f in ROW_FIELDS) == call.row_args(first, count)
        assert got["y"] == 0  # quantized output only: no out
        assert got["state"] == comm._state.ptr and got["timeout_ns"] == comm._timeout_ns
        assert got["call"] == number
        assert got["signature"] == layout.signature(
            "twostage", count * hidden, call.x.dtype, registered is not None,
            call.quant_code & 0xF, more=first + count < tokens)
        if registered is None:  # the kernel stages the chunk itself
            assert got["in"] == comm._staged_table.ptr and got["in_offset"] == 0
            assert got["stage_from"] == call.x.ptr + first * row
        else:
            assert got["in"] == registered and got["stage_from"] == 0
            assert got["in_offset"] == first * row // rmsnorm.PACK_BYTES  # in packs
    assert copies == []
    assert "allreduce_rmsnorm call 2 (twostage, 2 x 1024 bfloat16)" in comm._call_log.values()


@pytest.mark.parametrize("registered", [None, 0x5300_0000_0000])
def test_split_runs_each_chunk_as_its_two_kernels(source, dev, monkeypatch, registered):
    """Per chunk: kernel A on the capped grid (numbered: it spins; a staged
    input it copies into the scratch itself), then add_rmsnorm on this rank's gather buffer with
    the whole GPU's blocks, the chunk's row arguments and this rank's
    failure word (unnumbered: it waits for nothing), on the call's stream, in
    that order."""
    _, a_params = _split_entries(source)
    a_names = [n for _, n in a_params]
    b_names = [n for _, n in _local_entries(source)["pyar_add_rmsnorm_bf16_mxfp4_p1"]]
    tokens, hidden = 10, 4096
    row = hidden * 2
    comm = _comm(world=8, max_size=4 * row)  # 4 rows a chunk: 4 + 4 + 2
    order = []
    monkeypatch.setattr(communicator._hip, "memcpy_dtod",
                        lambda dst, src, n, stream=None: order.append(("copy", dst, src, n,
                                                                       stream)))
    q, s = _quant_outputs(dev, "mxfp4", tokens, hidden)
    call = _call(dev, tokens=tokens, hidden=hidden, quant="mxfp4", quantized=q, scales=s)
    steps = list(comm._rmsnorm_steps(call, algorithms.SPLIT, registered))
    for step in steps:
        comm._run_step(step, "S")
    functions = comm._row_kernels.module.functions
    kernel_a = functions["pyar_allreduce_rmsnorm_split_bf16_p1_w8"]
    kernel_b = functions["pyar_add_rmsnorm_bf16_mxfp4_p1"]
    assert set(functions) == {kernel_a.name, kernel_b.name}  # no two-stage kernel
    assert [step[0] for step in steps] == ["kernel", "local"] * 3
    gather = comm._buffer.ptr + comm._partial_offset
    for number, first in enumerate((0, 4, 8)):
        count = min(4, tokens - first)
        grid, block, args, stream = kernel_a.launches[number]
        got = dict(zip(a_names, args))
        # 512 threads a row of 4096 bf16; the cap (40 blocks of 512) beyond 4 rows
        assert (grid, block, stream) == (count, 512, "S")
        assert got == {"in": registered or comm._staged_table.ptr,
                       "in_offset": 0 if registered is None else first * row // 16,
                       "stage_from": call.x.ptr + first * row if registered is None else 0,
                       "tokens": count, "hidden": hidden, "state": comm._state.ptr,
                       "timeout_ns": comm._timeout_ns, "call": number,
                       "signature": layout.signature("split", count * hidden, call.x.dtype,
                                                     registered is not None, 2,
                                                     more=first + count < tokens)}
        grid, block, args, stream = kernel_b.launches[number]
        got = dict(zip(b_names, args))
        assert (grid, block, stream) == (count, 512, "S")
        assert got["x"] == gather and got["tokens"] == count
        assert got["failed"] == comm._buffer.ptr + comm._layout.failed_offset
        assert tuple(got[f] for f in ROW_FIELDS) == call.row_args(first, count)
    assert comm._calls == 3  # kernel B takes no call number
    assert "allreduce_rmsnorm call 2 (split, 2 x 4096 bfloat16)" in comm._call_log.values()
    assert order == []


def test_split_norms_on_the_whole_gpu_while_kernel_a_keeps_its_cap(dev):
    """4096 rows of 4096 bf16 at 8 ranks: kernel A on the fused cap, kernel B
    on two 512-thread blocks a multiprocessor like the unfused step."""
    comm = _comm(world=8, max_size=64 << 20)
    comm._max_fused_blocks[(algorithms.SPLIT, BF16)] = 16
    call = _call(dev, tokens=4096, hidden=4096)
    steps = list(comm._rmsnorm_steps(call, algorithms.SPLIT, 0x5300_0000_0000))
    (_, _, a_grid, a_block, _, _, _), (_, _, b_grid, b_block, b_args) = steps
    assert (a_grid, a_block) == (16, 512)
    assert (b_grid, b_block) == (264, 512)
    assert b_args[:2] == (comm._buffer.ptr + comm._partial_offset, 4096)


@pytest.mark.parametrize("world", [2, 5, 8])
def test_prepare_rmsnorm_picks_the_variant_by_input_bytes(dev, without_lamport, world):
    comm = _comm(world)
    limit = algorithms.FUSED_ONESTAGE_MAX_BYTES[world]
    hidden = 1024
    for tokens, want in ((limit // (2 * hidden), "onestage"),
                         (limit // (2 * hidden) + 1, "twostage")):
        call, algo, registered = comm._prepare_rmsnorm(
            dev((tokens, hidden), BF16), dev((tokens, hidden), BF16), dev((hidden,), BF16),
            1e-6, dev((tokens, hidden), BF16), None, None, None, 128, None, None, None,
            "auto")
        assert (algo, registered, call.tokens) == (want, None, tokens)
    # An explicit choice is kept.
    _, algo, _ = comm._prepare_rmsnorm(
        dev((1, hidden), BF16), dev((1, hidden), BF16), dev((hidden,), BF16), 1e-6,
        dev((1, hidden), BF16), None, None, None, 128, None, None, None, "twostage")
    assert algo == "twostage"


def test_prepare_rmsnorm_refuses_a_row_larger_than_the_scratch(dev):
    comm = _comm(2, max_size=4096)
    x = dev((2, 4096), F32)  # 16 KiB rows
    with pytest.raises(ValueError, match="does not fit"):
        comm._prepare_rmsnorm(x, dev(x.shape, F32), dev((4096,), F32), 1e-6, dev(x.shape, F32),
                              None, None, None, 128, None, None, None, "auto")


def test_prepare_rmsnorm_checks_algo_first(dev):
    comm = _comm(2)
    with pytest.raises(ValueError, match="'threestage'"):
        comm._prepare_rmsnorm(None, None, None, 1e-6, None, None, None, None, 128, None, None,
                              None, "threestage")


# --- 2. the choice of fused variant ----------------------------------------------------

SIZES = [0, 1, 16, 4096, 65536, 128 * 1024, 128 * 1024 + 16, 256 * 1024, 256 * 1024 + 16,
         512 * 1024, 512 * 1024 + 16, 1 << 20, 64 << 20, 1 << 30]


@pytest.mark.parametrize("world", range(2, 9))
def test_choose_fused_has_one_crossover_at_the_table(world, monkeypatch):
    monkeypatch.setitem(algorithms.FUSED_MAX_BYTES, world, None)  # fused at every size
    picks = [algorithms.choose_fused(n, world) for n in SIZES]
    assert set(picks) <= set(algorithms.FUSED_VARIANTS)
    assert picks[0] == "onestage" and picks[-1] == "twostage", picks
    switch = picks.index("twostage")
    assert picks == ["onestage"] * switch + ["twostage"] * (len(picks) - switch), picks
    limit = algorithms.FUSED_ONESTAGE_MAX_BYTES[world]
    assert algorithms.choose_fused(limit, world) == "onestage"
    assert algorithms.choose_fused(limit + 1, world) == "twostage"


def test_fused_table_covers_worlds_2_to_8():
    assert algorithms.FUSED_VARIANTS == ("onestage", "twostage")
    assert sorted(algorithms.FUSED_ONESTAGE_MAX_BYTES) == list(range(2, 9))
    for limit in algorithms.FUSED_ONESTAGE_MAX_BYTES.values():
        assert isinstance(limit, int) and limit > 0 and limit % 16 == 0


@pytest.mark.parametrize("world", [-1, 0, 1, 9, 16])
def test_choose_fused_rejects_worlds_outside_2_to_8(world):
    with pytest.raises(ValueError, match=r"world size %d \(supported: 2..8\)" % world):
        algorithms.choose_fused(4096, world)


@pytest.mark.parametrize("algo", ["auto", "onestage", "twostage", "split", "unfused",
                                  "lamport"])
def test_validate_fused_accepts(algo):
    assert algorithms.validate_fused(algo) == algo


@pytest.mark.parametrize("algo", ["", "oneshot", "one_stage", "ONESTAGE", "threestage", "SPLIT",
                                  "splits", None, 1])
def test_validate_fused_rejects_naming_the_algo(algo):
    with pytest.raises(ValueError) as error:
        algorithms.validate_fused(algo)
    assert "algo must be 'auto' or one of" in str(error.value)
    assert str(error.value).endswith(f"got {algo!r}")


@pytest.mark.parametrize("large", [algorithms.SPLIT, algorithms.UNFUSED])
@pytest.mark.parametrize("world", range(2, 9))
def test_choose_fused_runs_the_large_table_past_the_fused_crossover(world, large, monkeypatch):
    limit = 3 << 20
    monkeypatch.setitem(algorithms.FUSED_MAX_BYTES, world, limit)
    monkeypatch.setitem(algorithms.FUSED_LARGE, world, large)
    assert algorithms.choose_fused(limit, world) in algorithms.FUSED_VARIANTS
    assert algorithms.choose_fused(limit + 16, world) == large
    assert algorithms.choose_fused(1 << 30, world) == large
    # The other worlds keep their own entry.
    other = 2 if world != 2 else 3
    assert algorithms.choose_fused(1 << 30, other) == algorithms.FUSED_LARGE[other]
    # Below the crossover the one-stage/two-stage choice is unchanged.
    small = algorithms.FUSED_ONESTAGE_MAX_BYTES[world]
    assert algorithms.choose_fused(small, world) == "onestage"
    assert algorithms.choose_fused(small + 16, world) == "twostage"


@pytest.mark.parametrize("world", range(2, 9))
def test_choose_fused_with_the_shipped_tables_orders_the_three_paths(world):
    """onestage, then twostage, then the shipped FUSED_LARGE (split or
    unfused) as the input grows (a variant may have no sizes of its own when
    the next crossover comes first)."""
    large = algorithms.FUSED_LARGE[world]
    order = ("onestage", "twostage", large)
    picks = [order.index(algorithms.choose_fused(n, world)) for n in SIZES]
    assert picks == sorted(picks), picks
    assert picks[0] == 0 and picks[-1] == 2, picks
    assert algorithms.choose_fused(algorithms.FUSED_MAX_BYTES[world] + 16, world) == large


def test_fused_crossover_table_covers_worlds_2_to_8():
    assert sorted(algorithms.FUSED_MAX_BYTES) == list(range(2, 9))
    for limit in algorithms.FUSED_MAX_BYTES.values():
        assert limit is None or (isinstance(limit, int) and limit > 0 and limit % 16 == 0)
    assert algorithms.UNFUSED not in algorithms.FUSED_VARIANTS
    assert sorted(algorithms.FUSED_LARGE) == list(range(2, 9))
    assert set(algorithms.FUSED_LARGE.values()) <= {algorithms.SPLIT, algorithms.UNFUSED}


@pytest.mark.parametrize("world", range(2, 9))
def test_ranks_sharing_a_gpu_take_onestage_then_split_then_the_unfused_steps(world):
    """The shared-GPU table: one-stage up to its first bound, split up to the
    second, the unfused steps beyond; never two-stage.  Without a first bound
    (2-4 ranks) one-stage at every size."""
    onestage_max, split_max = algorithms.SHARED_GPU_FUSED[world]
    order = ("onestage", algorithms.SPLIT, algorithms.UNFUSED)
    picks = [order.index(algorithms.choose_fused(n, world, shared_gpu=True))
             for n in sorted(SIZES + [8 << 20, (8 << 20) + 16, 32 << 20, (32 << 20) + 16])]
    assert picks == sorted(picks), picks
    if onestage_max is None:
        assert algorithms.choose_fused(1 << 40, world, shared_gpu=True) == "onestage"
        return
    assert algorithms.choose_fused(onestage_max, world, shared_gpu=True) == "onestage"
    assert algorithms.choose_fused(onestage_max + 16, world, shared_gpu=True) == algorithms.SPLIT
    if split_max is None:
        assert algorithms.choose_fused(1 << 40, world, shared_gpu=True) == algorithms.SPLIT
    else:
        assert algorithms.choose_fused(split_max, world, shared_gpu=True) == algorithms.SPLIT
        assert algorithms.choose_fused(split_max + 16, world, shared_gpu=True) == \
            algorithms.UNFUSED


@pytest.mark.parametrize("world", range(2, 9))
def test_wide_rows_on_a_shared_gpu_leave_onestage_at_their_own_bound(world):
    """Rows over WIDE_ROW_BYTES leave one-stage at SHARED_GPU_WIDE_ONESTAGE_MAX;
    split's bound is the same for every row width; rows of WIDE_ROW_BYTES
    and narrower keep SHARED_GPU_FUSED's one-stage bound."""
    wide = algorithms.WIDE_ROW_BYTES + 16
    limit = algorithms.SHARED_GPU_WIDE_ONESTAGE_MAX[world]
    onestage_max, split_max = algorithms.SHARED_GPU_FUSED[world]
    assert 0 < limit < (onestage_max or 1 << 40) and limit % 16 == 0
    assert algorithms.choose_fused(limit, world, True, wide) == "onestage"
    assert algorithms.choose_fused(limit + 16, world, True, wide) == algorithms.SPLIT
    assert algorithms.choose_fused(limit + 16, world, True, algorithms.WIDE_ROW_BYTES) == \
        "onestage"
    if split_max is not None:
        assert algorithms.choose_fused(split_max + 16, world, True, wide) == algorithms.UNFUSED
    # A GPU per rank: the row width does not matter.
    assert algorithms.choose_fused(limit + 16, world, False, wide) == \
        algorithms.choose_fused(limit + 16, world)


def test_shared_gpu_table_covers_worlds_2_to_8():
    assert sorted(algorithms.SHARED_GPU_FUSED) == list(range(2, 9))
    for onestage_max, split_max in algorithms.SHARED_GPU_FUSED.values():
        assert onestage_max is None or (onestage_max > 0 and onestage_max % 16 == 0)
        assert split_max is None or (split_max % 16 == 0 and split_max > (onestage_max or 0))
    with pytest.raises(ValueError, match=r"world size 9 \(supported: 2..8\)"):
        algorithms.choose_fused(4096, 9, shared_gpu=True)


@pytest.mark.parametrize("shared_gpu", [False, True])
def test_prepare_rmsnorm_takes_the_table_of_its_topology(dev, without_lamport, shared_gpu):
    """Measured on one H200: at 4 ranks 256 and 1024 rows of 4096 bf16 (2 and
    8 MiB) run one-stage on a shared GPU; with a GPU per rank the first runs
    the GPU-per-rank table's large path."""
    comm = _comm(4)
    comm._shared_gpu = shared_gpu
    picks = [_picked(comm, dev, tokens, 4096) for tokens in (256, 1024)]
    assert picks == (["onestage", "onestage"] if shared_gpu else
                     [algorithms.choose_fused(n, 4) for n in (2 << 20, 8 << 20)])
    assert shared_gpu or picks[0] == algorithms.FUSED_LARGE[4]
    # Rows of 7168 bf16 (14 KiB): 64 rows run one-stage on a shared GPU, 128 split.
    hidden = 7168
    picks = [_picked(comm, dev, tokens, hidden) for tokens in (64, 128)]
    assert picks == (["onestage", algorithms.SPLIT] if shared_gpu else
                     [algorithms.choose_fused(n * hidden * 2, 4) for n in (64, 128)])


@pytest.mark.parametrize("large", [algorithms.SPLIT, algorithms.UNFUSED])
def test_prepare_rmsnorm_picks_the_large_path_past_the_crossover(dev, without_lamport,
                                                                monkeypatch, large):
    comm = _comm(4)
    monkeypatch.setitem(algorithms.FUSED_MAX_BYTES, 4, 64 << 10)
    monkeypatch.setitem(algorithms.FUSED_LARGE, 4, large)
    picks = [_picked(comm, dev, tokens, 1024) for tokens in (32, 33)]  # 64 KiB, one row more
    assert picks[0] in algorithms.FUSED_VARIANTS and picks[1] == large
    # Forced, both stay selectable whatever the table says.
    for algo in (algorithms.SPLIT, algorithms.UNFUSED):
        assert _picked(comm, dev, 1, 1024, algo) == algo


@pytest.mark.parametrize("world", [2, 5, 8])
@pytest.mark.parametrize("shared_gpu", [False, True])
def test_prepare_rmsnorm_runs_lamport_up_to_its_bound_unregistered(dev, world, shared_gpu):
    comm = _comm(world)
    comm._shared_gpu = shared_gpu
    limit = algorithms.LAMPORT_MAX_BYTES[world]
    hidden = 1024
    fits = limit // (2 * hidden)
    call, algo, registered = comm._prepare_rmsnorm(
        dev((fits, hidden), BF16), dev((fits, hidden), BF16), dev((hidden,), BF16), 1e-6,
        dev((fits, hidden), BF16), None, None, None, 128, None, None, None, "auto")
    assert (algo, registered) == ("lamport", None)  # peers never read x
    assert _picked(comm, dev, fits + 1, hidden) == algorithms.choose_fused(
        (fits + 1) * hidden * 2, world, shared_gpu, hidden * 2)


@pytest.mark.parametrize("world", range(2, 9))
def test_choose_fused_takes_lamport_only_where_it_fits(world):
    limit = algorithms.LAMPORT_MAX_BYTES[world]
    for shared_gpu in (False, True):
        assert algorithms.choose_fused(16, world, shared_gpu, 16, True) == "lamport"
        assert algorithms.choose_fused(limit, world, shared_gpu, 16, True) == "lamport"
        for nbytes in (limit + 16, 16):
            fits = nbytes > limit
            assert algorithms.choose_fused(nbytes, world, shared_gpu, 16, fits) == \
                algorithms.choose_fused(nbytes, world, shared_gpu, 16)


def test_lamport_table_covers_worlds_2_to_8_within_one_segment():
    assert sorted(algorithms.LAMPORT_MAX_BYTES) == list(range(2, 9))
    for limit in algorithms.LAMPORT_MAX_BYTES.values():
        assert isinstance(limit, int) and 0 <= limit <= algorithms.LAMPORT_SEGMENT_BYTES
        assert limit % 16 == 0


@pytest.mark.parametrize("world", [1, 2, 8])
def test_forced_lamport_refuses_what_its_kernels_and_slots_do_not_take(dev, world):
    """Alike at every world size (a world of one would run add_rmsnorm): rows
    over one pack a thread, inputs over one receive segment; "auto" then
    picks another variant."""
    comm = _comm(world, max_size=4 << 20)
    with pytest.raises(ValueError, match=r"algo='lamport' takes rows up to 16384 bytes \(one "
                                         r"16-byte pack per thread\), got 32768"):
        _picked(comm, dev, 1, 16384, "lamport")
    with pytest.raises(ValueError, match=r"algo='lamport' takes inputs up to 1048576 bytes "
                                         r"\(its receive slots\), got 1056768"):
        _picked(comm, dev, 129, 4096, "lamport")
    small = _comm(world, max_size=64 << 10)  # the slots shrink with max_size
    with pytest.raises(ValueError, match=r"takes inputs up to 65536 bytes"):
        _picked(small, dev, 9, 4096, "lamport")
    assert _picked(comm, dev, 8, 8192, "lamport") == "lamport"  # 16 KiB rows
    if world > 1:
        assert _picked(comm, dev, 1, 16384) != "lamport"
        assert _picked(comm, dev, 129, 4096) != "lamport"


def _picked(comm, dev, tokens, hidden, algo="auto"):
    """The variant _prepare_rmsnorm picks for ``tokens`` bf16 rows of ``hidden``."""
    return comm._prepare_rmsnorm(
        dev((tokens, hidden), BF16), dev((tokens, hidden), BF16), dev((hidden,), BF16), 1e-6,
        dev((tokens, hidden), BF16), None, None, None, 128, None, None, None, algo)[1]


@pytest.mark.parametrize("with_out", [True, False])
def test_unfused_runs_the_allreduce_then_the_local_row_kernel(dev, monkeypatch, with_out):
    """Past the crossover: pyar's all-reduce into out (or the communicator's
    sum array when only quantized output is wanted), then add + RMSNorm +
    quantization on that sum with the call's own outputs; no fused kernel.
    The steps are returned, so that the call is planned and replayed."""
    comm = _comm(4)
    tokens, hidden = 6, 4096
    q, s = _quant_outputs(dev, "mxfp4", tokens, hidden)
    call = _call(dev, tokens=tokens, hidden=hidden, quant="mxfp4", quantized=q, scales=s,
                 out="new" if with_out else None)
    reduced, allocated, forgotten = [], [], []

    def empty(shape, dtype, stream=None):
        allocated.append(dev(shape, dtype))
        return allocated[-1]

    def allreduce_steps(x, out, algo, registered):
        reduced.append((x, out, algo, registered))
        yield ("copy", out.ptr, x.ptr, 16)  # stands for the all-reduce's steps

    monkeypatch.setattr(communicator, "empty", empty)
    monkeypatch.setattr(comm, "_allreduce_steps", allreduce_steps)
    monkeypatch.setattr(comm, "_forget_plans", lambda: forgotten.append(1))
    monkeypatch.setattr(communicator._hip, "memcpy_dtod", lambda *args: None)
    comm._unfused_sums = None
    steps = comm._launch_rmsnorm(call, algorithms.UNFUSED, None, stream="S")
    (x, sums, algo, registered), = reduced
    assert x is call.x and registered is None
    assert algo == algorithms.choose(x.nbytes, 4)
    if with_out:
        assert sums is call.out and allocated == [] and forgotten == []
    else:  # the communicator's sum array, kept for the queued kernels and reused
        (kept,), = [allocated]
        assert kept.nbytes == call.x.nbytes and comm._unfused_sums is kept
        assert (sums.ptr, sums.shape, sums.dtype) == (kept.ptr, call.x.shape, call.x.dtype)
        assert forgotten == [1]  # plans named the array it replaced
        comm._launch_rmsnorm(call, algorithms.UNFUSED, None, stream="S")
        assert len(allocated) == 1 and reduced[1][1].ptr == kept.ptr and forgotten == [1]
    module = comm._row_kernels.module
    assert [name for name, _ in module.requests] == ["pyar_add_rmsnorm_bf16_mxfp4_p1"]
    function = module.functions["pyar_add_rmsnorm_bf16_mxfp4_p1"]
    grid, block, args, stream = function.launches[0]
    assert (grid, block, stream) == (tokens, 512, "S")
    assert args == (sums.ptr, tokens, *call.row_args(0, tokens), 0)  # no failure word
    assert steps == [("copy", sums.ptr, call.x.ptr, 16),
                     ("local", function, grid, block, args)]


# --- 3. argument checks: RowCall and Quantization ------------------------------------

@pytest.mark.parametrize("dtype", [F32, F16, BF16])
def test_a_plain_call_is_accepted(dev, dtype):
    hidden = 16384
    call = _call(dev, tokens=3, hidden=hidden, dtype=dtype)
    assert (call.tokens, call.hidden, call.eps) == (3, hidden, 1e-6)
    assert call.residual_out is call.residual  # in place by default
    assert call.quant is None and call.quantized is None and call.scales is None
    assert (call.quant_code, call.group) == (0, 0)
    assert call.agreement_key() == (3, hidden, str(dtype), 0, 0)
    assert call.outputs() == (call.out, call.residual, None, None)


@pytest.mark.parametrize("dtype", [np.float64, np.int32, U8])
def test_unsupported_dtype(dev, dtype):
    with pytest.raises(TypeError, match="allreduce_rmsnorm supports"):
        _call(dev, dtype=dtype, hidden=512, out=None)


@pytest.mark.parametrize("shape", [(2880,), (2, 4, 2880), ()])
def test_x_must_be_2d(dev, shape):
    x = dev(shape, BF16)
    with pytest.raises(ValueError, match="must be 2-D"):
        _call(dev, x=x, residual=dev(shape, BF16), weight=dev((2880,), BF16), out=None)


def test_residual_shape_must_match(dev):
    with pytest.raises(ValueError, match=r"residual has shape \(5, 2880\), x has \(4, 2880\)"):
        _call(dev, residual=dev((5, 2880), BF16))


@pytest.mark.parametrize("shape", [(2872,), (1, 2880), (2880, 1)])
def test_weight_shape_must_be_hidden(dev, shape):
    with pytest.raises(ValueError, match=r"expected \(2880,\) for hidden size 2880"):
        _call(dev, weight=dev(shape, BF16))


@pytest.mark.parametrize("which", ["residual", "weight"])
def test_residual_and_weight_dtype_must_match(dev, which):
    wrong = dev((4, 2880) if which == "residual" else (2880,), F16)
    with pytest.raises(TypeError, match=f"{which} has dtype float16, x has bfloat16"):
        _call(dev, **{which: wrong})


@pytest.mark.parametrize("dtype, hidden, ok", [
    (BF16, 2880, True), (BF16, 2884, False), (BF16, 8, True), (BF16, 4, False),
    (F16, 2888, True), (F16, 2890, False), (F32, 2884, True), (F32, 2882, False),
    (BF16, 16384, True), (BF16, 16392, False), (F32, 16384, True), (F32, 16388, False),
    (BF16, 0, False),
])
def test_hidden_is_whole_packs_up_to_the_maximum(dev, dtype, hidden, ok):
    if ok:
        assert _call(dev, dtype=dtype, hidden=hidden).hidden == hidden
    else:
        lanes = 16 // np.dtype(dtype).itemsize
        with pytest.raises(ValueError, match=f"hidden size {hidden} is not supported .* "
                                             f"multiple of {lanes} up to 16384"):
            _call(dev, dtype=dtype, hidden=hidden)


@pytest.mark.parametrize("eps", [-1e-6, float("nan"), float("inf"), -float("inf")])
def test_eps_must_be_finite_and_non_negative(dev, eps):
    with pytest.raises(ValueError, match="eps must be finite and >= 0"):
        _call(dev, eps=eps)


@pytest.mark.parametrize("eps", [0, 0.0, 1e-5, np.float32(1e-6), 1])
def test_eps_is_a_float(dev, eps):
    call = _call(dev, eps=eps)
    assert type(call.eps) is float and call.eps == float(eps)


@pytest.mark.parametrize("quant", ["fp8", "FP8_PER_TOKEN", "mxfp8", "", 1])
def test_unknown_quant_kind(dev, quant):
    with pytest.raises(ValueError, match="quant must be None or one of"):
        _call(dev, quant=quant)


def test_fp8_per_group_needs_hidden_divisible_by_group(dev):
    with pytest.raises(ValueError, match=r"hidden \(2880\) divisible by group_size \(128\)"):
        _call(dev, quant="fp8_per_group", group_size=128)


@pytest.mark.parametrize("dtype, group_size", [
    (BF16, 24), (BF16, 512), (BF16, 4), (BF16, 96), (F32, 256), (F32, 12), (F16, 1024)])
def test_unsupported_group_size(dev, dtype, group_size):
    hidden = group_size * 8  # whole packs and divisible by the group: only the group is wrong
    with pytest.raises(ValueError, match=f"group_size {group_size} is not supported"):
        _call(dev, dtype=dtype, hidden=hidden, quant="fp8_per_group", group_size=group_size)


@pytest.mark.parametrize("group_size", [0, -128, 128.0, "128", True, None])
def test_group_size_must_be_a_positive_int(dev, group_size):
    with pytest.raises(ValueError, match="group_size must be a positive int"):
        _call(dev, hidden=1024, quant="fp8_per_group", group_size=group_size)


@pytest.mark.parametrize("dtype, group_size", [
    (BF16, 8), (BF16, 16), (BF16, 64), (BF16, 128), (BF16, 256), (F16, 256), (F32, 4),
    (F32, 128), (BF16, 2880), (BF16, np.int64(32))])
def test_supported_group_sizes(dev, dtype, group_size):
    hidden = 2880 if group_size == 2880 else 1024
    q, s = _quant_outputs(dev, "fp8_per_group", 4, hidden, int(group_size))
    call = _call(dev, dtype=dtype, hidden=hidden, quant="fp8_per_group", group_size=group_size,
                 quantized=q, scales=s, out=None)
    assert call.group == group_size and type(call.group) is int
    assert call.scales.shape == (4, hidden // group_size)


@pytest.mark.parametrize("dtype, hidden", [(BF16, 2888), (F32, 36), (F16, 16376)])
def test_mxfp4_needs_hidden_divisible_by_32(dev, dtype, hidden):
    with pytest.raises(ValueError, match=f"mxfp4 needs hidden divisible by 32, got {hidden}"):
        _call(dev, dtype=dtype, hidden=hidden, quant="mxfp4")


@pytest.mark.parametrize("fp8_dtype", [np.float16, BF16, np.int8, U8,
                                       ml_dtypes.float8_e5m2, ml_dtypes.float8_e4m3b11fnuz])
def test_bad_fp8_dtype(dev, fp8_dtype):
    with pytest.raises(TypeError, match="fp8_dtype must be ml_dtypes.float8_e4m3fn or "
                                        "float8_e4m3fnuz"):
        _call(dev, quant="fp8_per_token", fp8_dtype=fp8_dtype)


@pytest.mark.parametrize("which", ["x", "residual", "weight", "out", "residual_out",
                                   "quantized", "scales"])
@pytest.mark.parametrize("offset", [2, 8])
def test_misaligned_pointer(dev, which, offset):
    tokens, hidden = 4, 1024
    arrays = {"x": (tokens, hidden), "residual": (tokens, hidden), "weight": (hidden,),
              "out": (tokens, hidden), "residual_out": (tokens, hidden)}
    q, s = _quant_outputs(dev, "fp8_per_group", tokens, hidden)
    given = {"quantized": q, "scales": s}
    for name, shape in arrays.items():
        given[name] = dev(shape, BF16)
    bad = given[which]
    given[which] = dev(bad.shape, bad.dtype, at=bad.ptr + offset)
    with pytest.raises(ValueError, match=f"{which} is not 16-byte aligned"):
        _call(dev, quant="fp8_per_group", **given)


def test_arrays_must_be_on_the_calls_device(dev):
    with pytest.raises(ValueError, match="weight lives on device 1, the call runs on device 0"):
        _call(dev, weight=dev((2880,), BF16, device=1))


def test_host_arrays_are_refused(dev):
    with pytest.raises(TypeError, match=r"host \(numpy\) array"):
        _call(dev, residual=np.zeros((4, 2880), BF16))


def test_foreign_arrays_are_ordered_before_the_calls_stream(dev, monkeypatch):
    """Each foreign array, input or output, is viewed for the call's stream:
    its producer orders its pending work before the kernels (asarray's
    ``stream``, which DLPack and the array interface pass on)."""
    views = {}
    asked = []

    def asarray(obj, stream=None):
        asked.append((obj, stream))
        return views[obj]

    monkeypatch.setattr(rmsnorm, "asarray", asarray)
    names = ("x", "residual", "weight", "out", "residual_out", "quantized", "scales")
    shapes = [((4, 2880), BF16)] * 2 + [((2880,), BF16)] + [((4, 2880), BF16)] * 2
    shapes += [((4, 2880), E4M3FN), ((4, 1), F32)]
    foreign = {name: object() for name in names}
    views.update({foreign[name]: dev(*shape) for name, shape in zip(names, shapes)})
    stream = 0x5555
    rmsnorm.RowCall(*(foreign[name] for name in names[:3]), 1e-6, foreign["out"],
                    foreign["residual_out"], "fp8_per_token", 128, E4M3FN,
                    foreign["quantized"], foreign["scales"], stream, 0, LAYOUT)
    name_of = {id(obj): name for name, obj in foreign.items()}
    assert sorted((name_of[id(obj)], s) for obj, s in asked) == sorted(
        (name, stream) for name in names)


@pytest.mark.parametrize("shape, dtype", [((4, 2872), BF16), ((3, 2880), BF16), ((4, 2880), F16),
                                          ((11520,), BF16)])
def test_out_with_wrong_shape_or_dtype(dev, shape, dtype):
    with pytest.raises(ValueError, match="out has shape .* expected"):
        _call(dev, out=dev(shape, dtype))


def test_read_only_outputs_are_refused(dev):
    with pytest.raises(ValueError, match="out is a read-only array"):
        _call(dev, out=dev((4, 2880), BF16, readonly=True))
    with pytest.raises(ValueError, match="residual_out is a read-only array"):
        _call(dev, residual_out=dev((4, 2880), BF16, readonly=True))


def test_output_over_an_input_is_refused(dev):
    x = dev((4, 2880), BF16)
    with pytest.raises(ValueError, match="out overlaps x"):
        _call(dev, x=x, out=x)
    with pytest.raises(ValueError, match="residual_out overlaps x"):
        _call(dev, x=x, residual_out=dev((4, 2880), BF16, at=x.ptr + 2 * 2880))
    x, residual = dev((4, 2880), BF16), dev((4, 2880), BF16)
    weight = dev((2880,), BF16)  # allocated last: an out starting 16 bytes before it
    with pytest.raises(ValueError, match="out overlaps weight"):  # overlaps only weight
        _call(dev, x=x, residual=residual, weight=weight,
              out=dev((4, 2880), BF16, at=weight.ptr - 16))
    residual = dev((4, 2880), BF16)
    with pytest.raises(ValueError, match="out overlaps residual"):
        _call(dev, residual=residual, out=residual)


def test_outputs_over_each_other_are_refused(dev):
    out = dev((4, 2880), BF16)
    with pytest.raises(ValueError, match="out overlaps residual_out"):
        _call(dev, out=out, residual_out=out)
    q = dev((4, 2880), E4M3FN)
    with pytest.raises(ValueError, match="scales overlaps quantized"):
        _call(dev, quant="fp8_per_token", quantized=q,
              scales=dev((4, 1), F32, at=q.ptr + 64))


def test_in_place_residual_over_x_is_refused(dev):
    x = dev((4, 2880), BF16)
    with pytest.raises(ValueError, match="residual overlaps x"):
        _call(dev, x=x, residual=x)


def test_in_place_residual_over_weight_is_refused(dev):
    # In place, residual is written while every row reads weight: it is an
    # output like a separate residual_out, which may not overlap weight.
    residual = dev((4, 2880), BF16)
    weight = dev((2880,), BF16, at=residual.ptr + 2880 * 2)  # residual's second row
    with pytest.raises(ValueError, match="residual_out overlaps weight"):
        _call(dev, weight=weight, residual_out=residual)  # (residual: a fresh array)
    with pytest.raises(ValueError, match="overlaps"):
        _call(dev, residual=residual, weight=weight)  # in place


def test_read_only_residual_is_not_written_in_place(dev):
    # residual_out=None writes residual: a read-only residual is refused like
    # a read-only out or residual_out ...
    residual = dev((4, 2880), BF16, readonly=True)
    with pytest.raises(ValueError, match="read-only"):
        _call(dev, residual=residual)
    # ... and is fine as a pure input.
    separate = dev((4, 2880), BF16)
    assert _call(dev, residual=residual, residual_out=separate).residual_out is separate


@pytest.mark.parametrize("given", ["quantized", "scales"])
def test_quantized_outputs_need_quant(dev, given):
    q, s = _quant_outputs(dev, "fp8_per_token", 4, 2880)
    with pytest.raises(ValueError, match="quantized= and scales= need quant="):
        _call(dev, **{given: q if given == "quantized" else s})


def test_residual_out_none_or_residual_means_in_place(dev):
    residual = dev((4, 2880), BF16)
    assert _call(dev, residual=residual).residual_out is residual
    assert _call(dev, residual=residual, residual_out=residual).residual_out is residual
    # Another view of exactly the same memory is the same array.
    alias = dev((4, 2880), BF16, at=residual.ptr)
    assert _call(dev, residual=residual, residual_out=alias).residual_out is residual
    separate = dev((4, 2880), BF16)
    call = _call(dev, residual=residual, residual_out=separate)
    assert call.residual_out is separate
    assert call.outputs().residual_out is separate


@pytest.mark.parametrize("dtype", [F32, F16, BF16])
@pytest.mark.parametrize("quant, fp8_dtype, q_last, q_dtype, s_cols, s_dtype, group, code", [
    ("fp8_per_token", E4M3FN, 1024, E4M3FN, 1, F32, 1024, 1),
    ("fp8_per_token", E4M3FNUZ, 1024, E4M3FNUZ, 1, F32, 1024, 0x11),
    ("fp8_per_group", E4M3FN, 1024, E4M3FN, 8, F32, 128, 1),
    ("fp8_per_group", E4M3FNUZ, 1024, E4M3FNUZ, 8, F32, 128, 0x11),
    ("mxfp4", None, 512, U8, 32, U8, 32, 2),
])
def test_quantized_outputs_per_kind(dev, dtype, quant, fp8_dtype, q_last, q_dtype, s_cols,
                                    s_dtype, group, code):
    tokens, hidden = 5, 1024
    q, s = dev((tokens, q_last), q_dtype), dev((tokens, s_cols), s_dtype)
    call = _call(dev, tokens=tokens, hidden=hidden, dtype=dtype, quant=quant,
                 fp8_dtype=fp8_dtype, quantized=q, scales=s, out=None)
    assert call.quantized is q and call.scales is s
    assert call.out is None  # no normed output unless asked for
    assert (call.quant.kind, call.group, call.quant_code) == (quant, group, code)
    assert call.quant.q_dtype == q_dtype and call.quant.scale_dtype == s_dtype
    assert call.agreement_key() == (tokens, hidden, str(dtype), code, group)
    assert call.outputs() == (None, call.residual, q, s)
    out = dev((tokens, hidden), dtype)
    assert _call(dev, tokens=tokens, hidden=hidden, dtype=dtype, quant=quant,
                 fp8_dtype=fp8_dtype, quantized=q, scales=s, out=out).out is out
    # Each quantized output with a wrong shape or dtype is refused.
    for name, good in (("quantized", q), ("scales", s)):
        wrong_shape = dev((tokens, good.shape[1] * 2), good.dtype)
        other = F16 if good.dtype != F16 else F32
        for wrong in (wrong_shape, dev(good.shape, other)):
            given = {"quantized": q, "scales": s, name: wrong}
            with pytest.raises(ValueError, match=f"{name} has shape .* expected"):
                _call(dev, tokens=tokens, hidden=hidden, dtype=dtype, quant=quant,
                      fp8_dtype=fp8_dtype, out=None, **given)


def test_fp8_codes_must_have_the_chosen_fp8_dtype(dev):
    q, s = _quant_outputs(dev, "fp8_per_token", 4, 2880, fp8_dtype=E4M3FNUZ)
    with pytest.raises(ValueError, match="quantized has shape .* float8_e4m3fn$"):
        _call(dev, quant="fp8_per_token", fp8_dtype=E4M3FN, quantized=q, scales=s)


@pytest.mark.parametrize("default", [E4M3FN, E4M3FNUZ])
def test_fp8_dtype_defaults_to_the_devices(dev, monkeypatch, default):
    asked = []
    monkeypatch.setattr(rmsnorm, "default_fp8_dtype", lambda device: asked.append(device)
                        or default)
    q, s = _quant_outputs(dev, "fp8_per_group", 4, 1024, fp8_dtype=default)
    call = _call(dev, hidden=1024, quant="fp8_per_group", fp8_dtype=None, quantized=q,
                 scales=s)
    assert asked == [0]
    assert call.quant.q_dtype == default
    assert call.quant_code == (0x11 if default == E4M3FNUZ else 1)
    # An explicit fp8_dtype does not ask the device.
    asked.clear()
    _call(dev, hidden=1024, quant="fp8_per_token", fp8_dtype=E4M3FN,
          quantized=dev((4, 1024), E4M3FN), scales=dev((4, 1), F32))
    mx = _quant_outputs(dev, "mxfp4", 4, 1024)
    _call(dev, hidden=1024, quant="mxfp4", fp8_dtype=None, quantized=mx[0], scales=mx[1])
    assert asked == []


@pytest.mark.parametrize("arch, want", [("gfx942", E4M3FNUZ), ("gfx940", E4M3FNUZ),
                                        ("gfx950", E4M3FN), ("gfx90a", E4M3FN),
                                        ("sm_90", E4M3FN)])
def test_default_fp8_dtype_by_arch(monkeypatch, arch, want):
    monkeypatch.setattr(rmsnorm._hip, "Device",
                        lambda ordinal: types.SimpleNamespace(arch=arch, ordinal=ordinal))
    assert rmsnorm.default_fp8_dtype(0) == want


def test_zero_tokens_is_accepted(dev):
    q, s = _quant_outputs(dev, "mxfp4", 0, 2880)
    call = _call(dev, tokens=0, hidden=2880, quant="mxfp4", quantized=q, scales=s)
    assert call.tokens == 0 and call.quantized.shape == (0, 1440)


# --- the benchmark's byte counts ---------------------------------------------------------

@pytest.mark.parametrize("world", [2, 4, 8])
def test_fused_traffic_counts_each_variants_bytes(world):
    from pyar.bench import traffic
    n, out = 32 << 20, 32 << 20  # 4096 rows of 4096 bf16 per rank, y as output
    rows = world * (2 * n + out)  # residual read, residual_out and y written
    assert traffic.fused_shared_gpu_bytes("onestage", n, out, world) == world * n + rows
    # Two-stage: every rank's gather buffer receives the whole reduced rows
    # and is read back.
    assert traffic.fused_shared_gpu_bytes("twostage", n, out, world) == 3 * world * n + rows
    # Split moves two-stage's bytes: the sums pushed, then read by the norm kernel.
    assert traffic.fused_shared_gpu_bytes("split", n, out, world) == 3 * world * n + rows
    # Lamport: each rank's input read once and stored into every rank's slot,
    # where it is read back and emptied.
    assert traffic.fused_shared_gpu_bytes("lamport", n, out, world) == \
        world * n + 3 * world * world * n + rows
    # Unfused: the all-reduce's bytes, then the sum read again by add + RMSNorm.
    allreduce = traffic.shared_gpu_bytes(algorithms.choose(n, world), n, world, False)
    assert traffic.fused_shared_gpu_bytes("unfused", n, out, world) == \
        allreduce + world * n + rows
    # ... which is split's plus the two-shot's reduced shards, written and read back.
    assert traffic.fused_shared_gpu_bytes("unfused", n, out, world) == \
        traffic.fused_shared_gpu_bytes("split", n, out, world) + 2 * n


@pytest.mark.parametrize("world", [2, 4, 8])
def test_add_rmsnorm_traffic_reads_sum_and_residual_writes_y_and_residual_out(world):
    from pyar.bench import traffic
    n = 8 << 20
    assert traffic.add_rmsnorm_shared_gpu_bytes(n, world) == world * (2 * n + 2 * n)
    # The unfused path's norm moves the same bytes as the fused rows without quantization.
    assert traffic.add_rmsnorm_shared_gpu_bytes(n, world) == \
        traffic.fused_shared_gpu_bytes("unfused", n, n, world) \
        - traffic.shared_gpu_bytes(algorithms.choose(n, world), n, world, False)
