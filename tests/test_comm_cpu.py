"""The communicator layer without a GPU (tier a): algorithm choice, the byte
layout and entry points shared with the kernels (pyar.comm.layout,
pyar.comm.kernels), the call signature, the exceptions, argument validation,
the buffer registry's table pool, and the MPI exchange helpers under mpirun
(tests/mpi/comm_cpu_exchange.py).  The planner and a node communicator's
calls: tests/test_node_calls_cpu.py; connecting a node (block caps, peer
access): tests/test_connection_cpu.py.

Importing pyar.comm initializes MPI in this process (a singleton, no mpirun
needed); the multi-rank checks run under mpirun.
"""
import os
import pickle
import re
import shutil
import struct
import types

import numpy as np
import pytest

pytest.importorskip("mpi4py")

from mpi4py import MPI  # noqa: E402

import pyar  # noqa: E402
from pyar.comm import (  # noqa: E402
    algorithms, communicator, exchange, factory, kernels, layout, registry,
)
from pyar.comm.errors import CollectiveTimeout, MismatchError, PeerAccessError  # noqa: E402
from tests.comm_stand_ins import RecordingModule  # noqa: E402
from tests.mpi_launch import ROOT, run_scenario  # noqa: E402

KERNELS = os.path.join(ROOT, "src", "kernels")
# The protocol header (structs, barriers) and the all-reduce kernels, read as one text.
KERNEL_SOURCES = [os.path.join(KERNELS, "pyar_protocol.h"), os.path.join(KERNELS, "allreduce.cu")]
HAVE_MPIRUN = shutil.which("mpirun") is not None or shutil.which("mpiexec") is not None
needs_mpirun = pytest.mark.skipif(not HAVE_MPIRUN, reason="mpirun not installed")


@pytest.fixture(scope="module")
def kernel_source():
    text = []
    for path in KERNEL_SOURCES:
        with open(path) as f:
            text.append(f.read())
    return "\n".join(text)


# --- algorithm choice --------------------------------------------------------------

SIZES = [0, 1, 16, 1000, 4096, 65536, 100_000, 128 * 1024, 128 * 1024 + 16, 256 * 1024,
         256 * 1024 + 16, 512 * 1024, 512 * 1024 + 16, 1 << 20, 8 << 20, 64 << 20, 1 << 30]


@pytest.mark.parametrize("world", range(2, 9))
def test_choose_is_monotonic_in_size(world):
    picks = [algorithms.choose(n, world) for n in SIZES]
    assert set(picks) <= set(algorithms.ALGORITHMS)
    assert picks[0] == "oneshot" and picks[-1] == "twoshot", picks
    # One crossover: once two-shot, two-shot for every larger message.
    first_two = picks.index("twoshot")
    assert all(p == "oneshot" for p in picks[:first_two]), picks
    assert all(p == "twoshot" for p in picks[first_two:]), picks
    # The crossover is where the table says.
    limit = algorithms.ONESHOT_MAX_BYTES[world]
    assert algorithms.choose(limit, world) == "oneshot"
    assert algorithms.choose(limit + 1, world) == "twoshot"


def test_choose_table_covers_exactly_worlds_2_to_8():
    assert sorted(algorithms.ONESHOT_MAX_BYTES) == list(range(2, 9))
    assert algorithms.ALGORITHMS == ("oneshot", "twoshot")
    for limit in algorithms.ONESHOT_MAX_BYTES.values():
        assert isinstance(limit, int) and limit > 0 and limit % 16 == 0


@pytest.mark.parametrize("world", [-1, 0, 1, 9, 16])
def test_choose_rejects_worlds_outside_2_to_8(world):
    with pytest.raises(ValueError, match="world size"):
        algorithms.choose(4096, world)


@pytest.mark.parametrize("algo", ["auto", "oneshot", "twoshot"])
def test_validate_accepts(algo):
    assert algorithms.validate(algo) == algo


@pytest.mark.parametrize("algo", ["", "one_shot", "ONESHOT", "threeshot", None, 1])
def test_validate_rejects(algo):
    with pytest.raises(ValueError, match="algo"):
        algorithms.validate(algo)


# --- the byte layout shared with the kernels ---------------------------------------

def test_layout_sizes():
    assert kernels.PACK_BYTES == 16
    assert layout.TABLE_BYTES == 64
    for world in range(0, 9):
        signals = [0x1000 * (r + 1) for r in range(world)]
        state = layout.pack_state(signals, [s + 8 for s in signals], 0xABC, 0, world)
        assert len(state) == 144, world
        assert len(layout.pack_table(signals)) == 64, world


def test_pack_state_field_placement():
    world = 5
    signals = [0x7F00_0000_0000 + 0x10_0000 * r for r in range(world)]
    partials = [s + 0x4_0000 for s in signals]
    state = layout.pack_state(signals, partials, 0xDEAD_BEEF_F00D, 3, world)
    # struct CommState { Signal *signals[8]; Pack16 *partial[8]; uint32_t *error;
    #                    uint32_t rank; uint32_t world; }  (little-endian, 64-bit)
    got_signals = struct.unpack_from("<8Q", state, 0)
    got_partials = struct.unpack_from("<8Q", state, 64)
    assert list(got_signals) == signals + [0] * (8 - world)
    assert list(got_partials) == partials + [0] * (8 - world)
    assert struct.unpack_from("<Q", state, 128) == (0xDEAD_BEEF_F00D,)
    assert struct.unpack_from("<II", state, 136) == (3, world)


def test_pack_table_field_placement():
    pointers = [0x1111, 0x2222, 0x3333]
    table = layout.pack_table(pointers)
    assert struct.unpack("<8Q", table) == tuple(pointers + [0] * 5)
    full = [0x10 * (r + 1) for r in range(8)]
    assert struct.unpack("<8Q", layout.pack_table(full)) == tuple(full)


def test_pack_refuses_more_than_8_ranks():
    with pytest.raises(struct.error):
        layout.pack_table(list(range(1, 10)))
    with pytest.raises(struct.error):
        layout.pack_state(list(range(1, 10)), list(range(1, 10)), 0, 0, 9)


def _struct_fields(source, name):
    body = re.search(r"struct %s \{(.*?)\n\};" % name, source, re.S)
    assert body, f"struct {name} not found in the kernel sources"
    fields = []
    for line in body.group(1).splitlines():
        code = line.split("//")[0].strip()
        if code and not code.startswith(("PYAR_DEVICE", "static", "}")):
            fields.append(re.sub(r"\s+", " ", code.rstrip(";")))
    return fields


def test_layout_matches_the_kernel_structs(kernel_source):
    """The host packs the fields in the order and widths the kernels declare."""
    assert _struct_fields(kernel_source, "CommState") == [
        "Signal *signals[kMaxRanks]", "Pack16 *partial[kMaxRanks]", "uint32_t *error",
        "uint32_t rank", "uint32_t world"]
    assert _struct_fields(kernel_source, "InputTable") == ["const Pack16 *ptr[kMaxRanks]"]
    assert re.search(r"constexpr int kMaxRanks = 8;", kernel_source)
    assert communicator.MAX_WORLD == 8
    # The error record: [0] failed, [1 + r] rank r missing, [1 + kMaxRanks] the call;
    # then the mismatch word and two words per rank's signature (PLAN section 1).
    assert "s.error[1 + kMaxRanks]" in kernel_source and "s.error[1 + peer]" in kernel_source
    assert (kernels.FAILED, kernels.MISSING, kernels.CALL) == (0, 1, 9)
    assert (kernels.MISMATCH, kernels.SIGNATURES) == (10, 11)
    assert kernels.ERROR_WORDS == 28 >= 11 + 2 * communicator.MAX_WORLD
    assert "s.error[2 + kMaxRanks], 1u" in kernel_source  # the mismatch word
    assert "s.error[3 + kMaxRanks + 2 * threadIdx.x]" in kernel_source  # low half, high next
    words = re.search(r"constexpr int kErrorWords = (\d+) \+ (\d+) \* kMaxRanks;", kernel_source)
    assert words and int(words[1]) + int(words[2]) * 8 <= kernels.ERROR_WORDS
    # The layout global lists what KernelLayout reads, in its order.
    init = re.search(r"pyar_allreduce_layout\[(\d+)\] = \{(.*?)\};", kernel_source, re.S)
    assert init, "pyar_allreduce_layout not found"
    entries = [e.strip() for e in re.split(r",(?![^()]*\))", init.group(2))]  # not offsetof's
    assert int(init.group(1)) == len(entries) == len(layout._LAYOUT_FIELDS)
    assert entries == ["sizeof(pyar::Signal)", "pyar::kMaxBlocks", "pyar::kMaxRanks",
                       "sizeof(pyar::CommState)", "pyar::kThreads",
                       "offsetof(pyar::Signal, some_block_failed)"]
    assert layout._LAYOUT_FIELDS == ("signal_bytes", "max_blocks", "max_ranks", "state_bytes",
                                     "threads", "failed_offset")


def _kernel_entries(source):
    """Every (name, parameter C types) the macros of allreduce.cu define."""
    entry = re.search(r"#define PYAR_ALLREDUCE_ENTRY\(algo, name, T, W\)(.*?)\{", source, re.S)
    params = re.search(r"_w##W\((.*?)\)", entry.group(1).replace("\\", ""), re.S).group(1)
    ctypes = [" ".join(re.match(r"(.*?)\w+$", p.strip()).group(1).split()).replace(" *", " *")
              for p in params.split(",")]
    worlds = [int(w) for w in re.findall(r"^\s*PYAR_ALLREDUCE_ENTRY\(algo, name, T, (\d+)\)",
                                         source, re.M)]
    types = re.findall(r"^\s*PYAR_ALLREDUCE_WORLDS\(algo, (\w+), [\w:]+\)", source, re.M)
    algos = re.findall(r"^PYAR_ALLREDUCE_TYPES\((\w+)\)", source, re.M)
    names = {f"pyar_allreduce_{a}_{t}_w{w}" for a in algos for t in types for w in worlds}
    return names, ctypes


def test_host_launches_kernels_the_source_defines(kernel_source):
    """Names and parameter lists a world's kernel set asks for exist in allreduce.cu."""
    names, ctypes = _kernel_entries(kernel_source)
    assert len(names) == 2 * 3 * 7, sorted(names)
    kinds = {"const pyar::InputTable *": "ptr", "pyar::Pack16 *": "ptr",
             "const pyar::Pack16 *": "ptr", "const pyar::CommState *": "ptr",
             "uint64_t": "uint64", "uint32_t": "uint32"}
    expected_argtypes = tuple(kinds[c] for c in ctypes)
    for world in range(2, 9):
        module = RecordingModule()
        kernel_set = kernels.KernelSet(world, module, RecordingModule(), rows=None)
        for algo in algorithms.ALGORITHMS:
            for dtype in kernels.DTYPE_NAMES:
                kernel_set.allreduce(algo, dtype)
                kernel_set.allreduce(algo, dtype)  # cached: asked once
        assert len(module.requests) == 6
        for name, argtypes in module.requests:
            assert name in names, name
            assert argtypes == expected_argtypes, (name, argtypes, ctypes)


def test_kernel_dtypes():
    import ml_dtypes
    assert set(kernels.DTYPE_NAMES) == {
        np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)}


# --- the call signature (PLAN section 1) ---------------------------------------------

BF16 = np.dtype("bfloat16")


def test_signature_bit_positions():
    """bits 0-39 elements, 40-47 operation, 48-51 dtype, 52 registered,
    53-56 quantization, 57 more chunks of the call follow, 58-63 zero."""
    assert layout.signature("oneshot", 4096, np.float32, False) == 4096 | 1 << 40 | 1 << 48
    assert layout.signature("all_gather", 0, np.float16, True) == 7 << 40 | 2 << 48 | 1 << 52
    assert layout.signature("onestage", 5, BF16, False, 0xF) == (
        5 | 3 << 40 | 3 << 48 | 0xF << 53)
    assert layout.OPERATIONS == {"oneshot": 1, "twoshot": 2, "onestage": 3, "twostage": 4,
                                 "split": 5, "reduce_scatter": 6, "all_gather": 7, "lamport": 8,
                                 "ll": 9, "ll_twoshot": 10}
    assert layout.signature("split", (1 << 40) - 1, BF16, True, 0xF) < 1 << 57
    assert layout.signature("oneshot", 4096, np.float32, False, more=True) == (
        4096 | 1 << 40 | 1 << 48 | 1 << 57)


@pytest.mark.parametrize("operation", sorted(layout.OPERATIONS))
@pytest.mark.parametrize("dtype", [np.dtype(np.float32), np.dtype(np.float16), BF16])
@pytest.mark.parametrize("elements", [0, 1, 4096, 4097, (1 << 40) - 1])
def test_signature_round_trip(operation, dtype, elements):
    for registered in (False, True):
        for quantization in (0, 1, 2, 15):
            for more in (False, True):
                value = layout.signature(operation, elements, dtype, registered, quantization,
                                         more)
                assert layout.decode_signature(value) == (operation, elements, dtype,
                                                          registered, quantization, more)


def test_signatures_differ_in_every_field():
    base = ("twoshot", 4096, BF16, False, 0)
    variants = [("oneshot", 4096, BF16, False, 0), ("twoshot", 4097, BF16, False, 0),
                ("twoshot", 4096, np.float16, False, 0), ("twoshot", 4096, BF16, True, 0),
                ("twoshot", 4096, BF16, False, 1), ("twoshot", 4096, BF16, False, 0, True)]
    values = {layout.signature(*v) for v in [base, *variants]}
    assert len(values) == 7


@pytest.mark.parametrize("bad", [dict(elements=-1), dict(elements=1 << 40),
                                 dict(quantization=16), dict(quantization=-1)])
def test_signature_refuses_what_does_not_fit(bad):
    args = dict(operation="oneshot", elements=1, dtype=np.float32, registered=False,
                quantization=0)
    args.update(bad)
    with pytest.raises(ValueError, match="does not fit|do not fit"):
        layout.signature(**args)


def test_signature_descriptions():
    assert layout.describe_signature(layout.signature("twoshot", 4096, BF16, False)) == (
        "allreduce twoshot 4096 x bfloat16 staged")
    assert layout.describe_signature(layout.signature("onestage", 8192, np.float16, True, 1)) \
        == "allreduce_rmsnorm onestage 8192 x float16 registered, fp8 quantization"
    assert layout.describe_signature(layout.signature("split", 8192, BF16, False)) == (
        "allreduce_rmsnorm split 8192 x bfloat16 staged, no quantization")
    assert layout.describe_signature(layout.signature("reduce_scatter", 7, BF16, True, 1)) \
        == "reduce_scatter 7 x bfloat16 registered, float32 output"
    assert layout.describe_signature(layout.signature("reduce_scatter", 7, BF16, True)) == (
        "reduce_scatter 7 x bfloat16 registered, bfloat16 output")
    assert layout.describe_signature(layout.signature("all_gather", 9, np.float32, False)) == (
        "all_gather 9 x float32 staged")
    assert layout.describe_signature(layout.signature("ll", 4096, BF16, False)) == (
        "allreduce ll 4096 x bfloat16 unstaged")
    assert layout.describe_signature(layout.signature("ll_twoshot", 7, np.float16, False)) == (
        "allreduce ll_twoshot 7 x float16 unstaged")
    assert "unknown call" in layout.describe_signature(11 << 40 | 1 << 48)
    assert "unknown call" in layout.describe_signature(1 << 60 | 1 << 40 | 1 << 48)
    assert layout.describe_signature(layout.signature("oneshot", 8, BF16, True, more=True)) == (
        "allreduce oneshot 8 x bfloat16 registered (a chunk; more of the call follow)")
    assert "did not arrive" in layout.describe_signature(0)


# --- exceptions -------------------------------------------------------------------

def test_collective_timeout_pickles():
    error = CollectiveTimeout("allreduce call 7 (oneshot, 1024 x float32)", [2, 3], 1, 2.5)
    assert isinstance(error, RuntimeError)
    text = str(error)
    assert "allreduce call 7" in text and "rank 1" in text and "2, 3" in text and "2.5" in text
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is CollectiveTimeout
    assert (copy.call, copy.missing, copy.rank, copy.timeout, copy.sequence) == (
        error.call, (2, 3), 1, 2.5, None)
    numbered = CollectiveTimeout("allreduce call 7", [2], 1, 2.5, sequence=7)
    assert pickle.loads(pickle.dumps(numbered)).sequence == 7
    assert str(copy) == text
    nobody = CollectiveTimeout("a collective", [], 0, 300.0)
    assert "not every rank arrived within 300 s" in str(nobody)
    assert pickle.loads(pickle.dumps(nobody)).missing == ()
    late = CollectiveTimeout("register (host-side exchange)", [], 2, 5.0, late=True)
    assert "given up after waiting 5 s" in str(late) and "rank 2" in str(late)
    copy = pickle.loads(pickle.dumps(late))
    assert copy.late and str(copy) == str(late)


def test_mismatch_error_pickles():
    error = MismatchError("ranks disagree on x: ranks [0]: 1; ranks [1]: 2")
    assert isinstance(error, ValueError)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is MismatchError and str(copy) == str(error)


def test_exceptions_are_exported_from_pyar():
    assert pyar.CollectiveTimeout is CollectiveTimeout
    assert pyar.MismatchError is MismatchError
    assert pyar.PeerAccessError is PeerAccessError
    assert pyar.Communicator is factory.Communicator
    for name in ("CollectiveTimeout", "Communicator", "MismatchError", "PeerAccessError"):
        assert name in pyar.__all__


def test_peer_access_error_pickles_and_names_both_gpus():
    error = PeerAccessError(1, "0000:19:00.0", 3, "0000:9b:00.0", "mapping its memory failed")
    assert isinstance(error, RuntimeError)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is PeerAccessError and str(copy) == str(error)
    assert (copy.rank, copy.bus_id, copy.peer_rank, copy.peer_bus_id) == (
        1, "0000:19:00.0", 3, "0000:9b:00.0")
    for part in ("rank 1", "0000:19:00.0", "rank 3", "0000:9b:00.0", "mapping its memory"):
        assert part in str(error)


# --- argument validation before any GPU call --------------------------------------

@pytest.mark.parametrize("max_size", [0, -1, -(1 << 20), 1.5, float(1 << 20), True, "1024",
                                      None])
def test_communicator_rejects_bad_max_size(max_size):
    with pytest.raises(ValueError, match="max_size"):
        pyar.Communicator(MPI.COMM_WORLD, max_size=max_size)


@pytest.mark.parametrize("timeout", [0, 0.0, -1, -0.5, float("nan"), "soon"])
def test_communicator_rejects_bad_timeout(timeout):
    with pytest.raises(ValueError):
        pyar.Communicator(MPI.COMM_WORLD, timeout=timeout)


@pytest.mark.parametrize("value", ["0", "-3", "never"])
def test_communicator_rejects_bad_timeout_from_environment(monkeypatch, value):
    monkeypatch.setenv("PYAR_TIMEOUT", value)
    with pytest.raises(ValueError):
        pyar.Communicator(MPI.COMM_WORLD)


@pytest.mark.parametrize("timeout", [float("inf"), 1e12])
def test_communicator_rejects_unrepresentable_timeout(timeout):
    with pytest.raises(ValueError):
        pyar.Communicator(MPI.COMM_WORLD, timeout=timeout)


@pytest.mark.parametrize("comm", [None, object(), 42, "COMM_WORLD", MPI.COMM_NULL])
def test_communicator_needs_an_mpi_intracommunicator(comm):
    with pytest.raises(TypeError, match="intra-communicator"):
        pyar.Communicator(comm)


def test_exchange_helpers_on_one_rank():
    world = MPI.COMM_WORLD
    assert world.Get_size() == 1  # this process is an MPI singleton
    split = exchange.ipc_split(world)
    assert split.domain.Get_size() == 1 and split.rail is None
    split.free()
    assert exchange.run_everywhere(world, lambda a, b: a + b, 2, 3) == 5
    with pytest.raises(KeyError):
        exchange.run_everywhere(world, {}.__getitem__, "missing")
    assert exchange.check_agreement(world, "anything", (1, "x")) is None
    assert exchange.agree_min(world, 17) == 17


# --- the buffer registry's table pool ----------------------------------------------

class _FakeMemory:
    """Device memory stand-in: distinct, aligned addresses, never dereferenced."""
    next_address = 1 << 40

    def __init__(self, size):
        self.ptr = _FakeMemory.next_address
        _FakeMemory.next_address += -(-size // 4096) * 4096 + 4096


def _registry_without_gpu(monkeypatch):
    resources = types.SimpleNamespace(device_memory=lambda size: _FakeMemory(size))
    buffers = registry.BufferRegistry(MPI.COMM_WORLD, resources)
    # Handles are exchanged through the HIP layer; only the tables' bookkeeping is tested.
    monkeypatch.setattr(buffers, "_exchange", lambda entries: buffers._tables.update(
        ((address, nbytes), table) for address, nbytes, table in entries))
    return buffers


def test_registry_serves_many_captures_one_buffer_each(monkeypatch):
    """A server captures one graph per batch size, each reading a new view:
    far more captures than one block of tables, none may run out."""
    buffers = _registry_without_gpu(monkeypatch)
    tables = set()
    for view in range(3 * registry.TABLES_PER_BLOCK + 5):
        array = types.SimpleNamespace(ptr=1 << 20, nbytes=256 * (view + 1))
        tables.add(buffers.defer(array))
        assert buffers.pending == 1
        buffers.exchange_deferred()
        assert buffers.lookup(array.ptr, array.nbytes) in tables
    assert len(tables) == 3 * registry.TABLES_PER_BLOCK + 5  # no table handed out twice


def test_registry_refuses_a_capture_beyond_the_pool(monkeypatch):
    buffers = _registry_without_gpu(monkeypatch)
    for view in range(registry.TABLES_PER_BLOCK):
        buffers.defer(types.SimpleNamespace(ptr=1 << 20, nbytes=256 * (view + 1)))
    with pytest.raises(RuntimeError, match="register_graph_buffers"):
        buffers.defer(types.SimpleNamespace(ptr=1 << 21, nbytes=256))
    buffers.discard_deferred()
    assert buffers.pending == 0
    buffers.defer(types.SimpleNamespace(ptr=1 << 21, nbytes=256))  # tables were returned


# --- the exchange helpers under mpirun --------------------------------------------

CPU_SCENARIO_ENV = {"PYAR_SCENARIO_WATCHDOG": "90"}


@needs_mpirun
@pytest.mark.parametrize("nranks", [2, 3])
def test_exchange_under_mpirun(nranks):
    """ipc_split, run_everywhere (a step failing on some ranks raises on
    all; the others' RuntimeError names the failing rank), check_agreement
    (MismatchError on every rank naming ranks and values), agree_min, and
    Communicator()'s collective checks before its first GPU call."""
    _, rows = run_scenario("comm_cpu_exchange", nranks, "exchange", timeout=120,
                           env=CPU_SCENARIO_ENV)
    assert rows == [{"test": "comm-cpu-exchange", "world": nranks, "failed_checks": 0}]


@needs_mpirun
def test_communicator_refuses_more_than_8_ranks():
    _, rows = run_scenario("comm_cpu_exchange", 9, "too-many", timeout=180,
                           env=CPU_SCENARIO_ENV)
    assert rows == [{"test": "comm-cpu-too-many", "world": 9, "failed_checks": 0}]


@needs_mpirun
@pytest.mark.parametrize("nranks", [3])  # two waiting ranks; 2, 4 and 8 run on the GPU
def test_host_steps_are_bounded_by_the_timeout(nranks):
    """A rank that never reaches a host-side step (a named one, and
    Communicator() itself) makes the others raise CollectiveTimeout naming
    the step and the rank after about the timeout; the late rank raises too."""
    _, rows = run_scenario("comm_cpu_exchange", nranks, "bounded", timeout=120,
                           env=CPU_SCENARIO_ENV)
    assert rows == [{"test": "comm-cpu-bounded", "world": nranks, "failed_checks": 0}]


@needs_mpirun
def test_run_everywhere_survives_an_unpicklable_exception():
    _, rows = run_scenario("comm_cpu_exchange", 2, "unpicklable", timeout=120,
                           env=dict(CPU_SCENARIO_ENV, PYAR_HANG_SECONDS="8"))
    assert rows == [{"test": "comm-cpu-unpicklable", "world": 2, "failed_checks": 0}]
