"""The eager hot path without a GPU (tier a): a call whose signature was
planned before is replayed without its checks, and every change the checks
depend on sends it back through them (pyar/comm/_eager.pyx).

The Communicator is made with ``__new__`` plus the attributes the calls read,
as in tests/test_comm_cpu.py; kernels are recording stand-ins (a staged
kernel copies its input itself), the host's copies of inputs that are not
16-byte aligned go to a monkeypatched ``memcpy_dtod``, and plans are compiled into a
recording LaunchSequence stand-in (``_sequence_type``), whose ``run`` calls
are the replays.  Arrays are ``DeviceArray.from_pointer`` on made-up
addresses with ``device`` given (no GPU call).
"""
import contextlib
import ctypes
import sys
import types

import numpy as np
import pytest

pytest.importorskip("mpi4py")

import pyar  # noqa: E402
from pyar import _hip  # noqa: E402
from pyar.array import foreign  # noqa: E402
from pyar.comm import _eager, algorithms, communicator, layout  # noqa: E402

F16 = np.dtype(np.float16)


class Function:
    argtypes = ("ptr", "uint64", "ptr", "ptr", "ptr", "uint64", "uint64", "uint64", "uint32")

    def __init__(self):
        self.launches = []

    def launch(self, grid, block, args=(), shared_mem=0, stream=None):
        self.launches.append((grid, block, tuple(args), stream))


class Sequence:
    """Records what a plan was compiled from and each replay."""
    made = []

    def __init__(self):
        self.steps, self.runs = [], []
        Sequence.made.append(self)

    def add_copy(self, dst, src, size, out_offset=None):
        self.steps.append(("copy", dst, src, size, out_offset))

    def add_kernel(self, function, grid, block, args=(), shared_mem=0, *, call_arg=None,
                   out_args=None):
        self.steps.append(("kernel", function, grid, block, args, call_arg, out_args))

    def run(self, stream, first_call=0, out=0):
        self.runs.append((stream, first_call, out))


def node_stand_in():
    """What the per-call path reads of the node communicator (pyar.comm.bounded)."""
    return types.SimpleNamespace(failure=None, step=lambda name: contextlib.nullcontext())


@pytest.fixture
def comm(monkeypatch):
    c = communicator.Communicator.__new__(communicator.Communicator)
    c._node = node_stand_in()
    c.world, c.rank, c.device, c.max_size = 4, 0, 0, 4096
    c._calls, c._call_log, c._functions = 0, {}, {}
    c._layout = types.SimpleNamespace(threads=512)
    c._max_blocks = 3
    c._buffer = types.SimpleNamespace(ptr=0x5000_0000_0000)
    c._scratch_offset = 0x1000
    c._staged_table = types.SimpleNamespace(ptr=0x5100_0000_0000)
    c._state = types.SimpleNamespace(ptr=0x5200_0000_0000)
    c._timeout_ns, c.timeout = 10**9, 1.0
    c._error_words = None  # no timeout record until a test gives one
    c._registry = types.SimpleNamespace(lookup=lambda ptr, nbytes: None,
                                        exchange_deferred=lambda: None)
    c.function = Function()
    c._function = lambda algo, dtype: c.function
    c._sequence_type = Sequence
    c.copies = []
    monkeypatch.setattr(communicator._hip, "memcpy_dtod",
                        lambda dst, src, n, stream=None: c.copies.append((dst, src, n)))
    c.prepared = 0
    prepare = c._prepare

    def counting_prepare(*args):
        c.prepared += 1
        return prepare(*args)

    c._prepare = counting_prepare
    Sequence.made.clear()
    return c


def array(address, count=1000, dtype=F16, owner=None, readonly=False):
    return pyar.DeviceArray.from_pointer(address, (count,), dtype, owner=owner, device=0,
                                         readonly=readonly)


X, Y = 0x7000_0000_0000, 0x7100_0000_0000


def test_a_repeated_call_replays_its_plan(comm):
    x, y = array(X), array(Y)
    assert comm.allreduce(x, out=y) is y
    assert comm.prepared == 1 and len(comm.function.launches) == 1 and comm.copies == []
    (plan,) = Sequence.made
    # Compiled from exactly the steps the checked call ran, call number last: one
    # kernel, which stages x itself.
    (grid, block, args, _), = comm.function.launches
    assert args[2] == X
    assert plan.steps == [("kernel", comm.function, grid, block, (*args[:-1], 0), 8, {})]
    # The signature is fixed per planned step, so the plan carries it as it is.
    assert args[-2] == layout.signature("oneshot", 1000, F16, False)
    for _ in range(3):
        assert comm.allreduce(x, out=y) is y
    assert comm.prepared == 1 and len(comm.function.launches) == 1  # nothing checked again
    assert plan.runs == [(0, 1, 0), (0, 2, 0), (0, 3, 0)]  # call numbers go on
    assert comm._calls == 4
    assert comm._replayed_call(3) == "allreduce call 3 (oneshot, 1000 x float16)"
    assert comm._replayed_call(0) is None  # checked: in the call log
    assert comm._call_log[0] == "allreduce call 0 (oneshot, 1000 x float16)"
    # A new object over the same memory is the same signature.
    assert comm.allreduce(array(X), out=array(Y)) is not None
    assert comm.prepared == 1 and len(plan.runs) == 4


def test_chunked_calls_replay_every_chunk(comm):
    count = 2 * comm.max_size // 2 + 100  # two whole chunks and a short one
    x, y = array(X, count), array(Y, count)
    comm.allreduce(x, out=y)
    (plan,) = Sequence.made
    kernels = [s for s in plan.steps if s[0] == "kernel"]
    assert len(kernels) == 3 and len(plan.steps) == 3  # no copies: the kernels stage
    assert [s[4][2] for s in kernels] == [X, X + 4096, X + 8192]
    comm.allreduce(x, out=y)
    assert plan.runs == [(0, 3, 0)] and comm._calls == 6


def test_an_unaligned_input_is_copied_before_its_kernel(comm):
    """The kernels stage whole 16-byte packs: an input that is not 16-byte aligned is
    copied into the scratch by a step of its own, and the kernel stages nothing."""
    x, y = array(X + 2), array(Y)
    comm.allreduce(x, out=y)
    (plan,) = Sequence.made
    assert [s[0] for s in plan.steps] == ["copy", "kernel"]
    assert plan.steps[0][1:4] == (comm._buffer.ptr + comm._scratch_offset, X + 2, 2000)
    assert plan.steps[1][4][:3] == (comm._staged_table.ptr, 0, 0)
    assert comm.copies == [(comm._buffer.ptr + comm._scratch_offset, X + 2, 2000)]


def test_each_part_of_the_signature_gets_its_own_plan(comm, monkeypatch):
    monkeypatch.setattr(_eager, "stream_is_capturing", lambda handle: False)
    comm._input_table = lambda x, stream: None  # asks the stream whether it captures
    x, y = array(X), array(Y)
    comm.allreduce(x, out=y)
    comm.allreduce(x, out=array(Y + 0x10000))           # another output
    comm.allreduce(x, out=y, algo="twoshot")             # another algorithm
    comm.allreduce(x, out=y, stream=0x1234)              # another stream
    comm.allreduce(array(X, 999), out=array(Y, 999))     # another size
    assert comm.prepared == 5 and len(Sequence.made) == 5
    comm.allreduce(x, out=y, stream=0x1234)
    assert comm.prepared == 5 and Sequence.made[3].runs == [(0x1234, 5, 0)]


def test_bad_input_still_raises_the_checks_errors(comm):
    x, y = array(X), array(Y)
    comm.allreduce(x, out=y)
    with pytest.raises(ValueError, match="out is a read-only array"):
        comm.allreduce(x, out=array(Y, readonly=True))
    with pytest.raises(ValueError, match="partially overlaps"):
        comm.allreduce(x, out=array(X + 16))
    with pytest.raises(TypeError, match="host"):
        comm.allreduce(np.zeros(1000, F16), out=y)
    with pytest.raises(ValueError, match="algo"):
        comm.allreduce(x, out=y, algo="threeshot")
    with pytest.raises(ValueError, match="algo"):  # not a key: the checks say why
        comm.allreduce(x, out=y, algo=["oneshot"])


def test_a_freed_array_is_checked_again(comm):
    comm.allreduce(array(X), out=array(Y))
    freed = _hip.PoolMemory.__new__(_hip.PoolMemory)  # never allocated: closed
    assert freed.closed
    with pytest.raises(ValueError, match="was freed"):
        comm.allreduce(array(X, owner=freed), out=array(Y))
    with pytest.raises(ValueError, match="was freed"):
        comm.allreduce(array(X), out=array(Y, owner=freed))


class Memory(_hip.PoolMemory):
    """Pool memory whose freeing a test decides."""
    closed = False

    def __init__(self):
        pass


def test_memory_freed_under_a_replayed_array_is_caught(comm):
    memory = Memory()
    x, y = array(X, owner=memory), array(Y)
    comm.allreduce(x, out=y)
    comm.allreduce(x, out=y)  # replayed, found by the arrays' identity
    assert len(Sequence.made[0].runs) == 1
    memory.closed = True
    with pytest.raises(ValueError, match="was freed"):
        comm.allreduce(x, out=y)
    with pytest.raises(ValueError, match="was freed"):
        comm.allreduce(y, out=x)
    assert len(Sequence.made[0].runs) == 1


def test_closed_or_failed_communicators_are_not_replayed(comm):
    x, y = array(X), array(Y)
    comm.allreduce(x, out=y)
    comm._failure = pyar.CollectiveTimeout("allreduce call 0", [1], 0, 1.0)
    with pytest.raises(pyar.CollectiveTimeout):
        comm.allreduce(x, out=y)
    comm._failure = None
    comm._node.failure = pyar.CollectiveTimeout("register (host-side exchange)", [1], 0, 1.0)
    with pytest.raises(pyar.CollectiveTimeout, match="host-side"):
        comm.allreduce(x, out=y)
    comm._node.failure = None
    comm._closed = True
    with pytest.raises(ValueError, match="closed"):
        comm.allreduce(x, out=y)
    assert Sequence.made[0].runs == []


def test_a_timeout_record_sends_the_call_to_the_checks(comm):
    x, y = array(X), array(Y)
    comm.allreduce(x, out=y)
    words = (ctypes.c_uint32 * communicator._ERROR_WORDS)()
    comm._error_words, comm._error_ptr = words, ctypes.addressof(words)
    comm.allreduce(x, out=y)
    assert len(Sequence.made[0].runs) == 1  # a clear record: replayed
    words[0], words[1 + 2], words[1 + communicator.MAX_WORLD] = 1, 1, 1
    with pytest.raises(pyar.CollectiveTimeout, match=r"allreduce call 1 \(oneshot"):
        comm.allreduce(x, out=y)
    assert len(Sequence.made[0].runs) == 1


def test_debug_checks_every_call(comm, monkeypatch):
    agreed = []
    monkeypatch.setattr(communicator.exchange, "run_everywhere",
                        lambda node, f, *a: f(*a))
    monkeypatch.setattr(communicator.exchange, "check_agreement",
                        lambda node, what, value: agreed.append(value))
    comm.debug = True
    x, y = array(X), array(Y)
    for _ in range(3):
        comm.allreduce(x, out=y)
    assert len(agreed) == 3 and comm.prepared == 3 and Sequence.made == []


def test_registry_changes_forget_every_plan(comm):
    x, y = array(X), array(Y)
    comm.allreduce(x, out=y)
    table = 0x5300_0000_0000
    comm._registry.lookup = lambda ptr, nbytes: table if ptr == X else None
    comm.register_graph_buffers()  # the registry changed: x is now read in place
    comm.allreduce(x, out=y)
    assert comm.prepared == 2
    staged, registered = Sequence.made
    assert [s[0] for s in staged.steps] == ["kernel"] and staged.runs == []
    assert staged.steps[0][4][:3] == (comm._staged_table.ptr, 0, X)
    assert [s[0] for s in registered.steps] == ["kernel"]
    assert registered.steps[0][4][:3] == (table, 0, 0)


def test_capturing_streams_are_checked_and_registered(comm, monkeypatch):
    capturing = []
    monkeypatch.setattr(_eager, "stream_is_capturing", lambda handle: bool(capturing))
    comm._input_table = lambda x, stream: None
    x, y = array(X), array(Y)
    comm.allreduce(x, out=y, stream=0x1234)
    capturing.append(True)
    comm.allreduce(x, out=y, stream=0x1234)
    assert comm.prepared == 2 and Sequence.made[0].runs == []
    capturing.clear()
    comm.allreduce(x, out=y, stream=0x1234)
    assert comm.prepared == 2 and Sequence.made[0].runs == [(0x1234, 2, 0)]


def test_pool_memory_cannot_be_registered(comm):
    pool = array(X, owner=_hip.PoolMemory.__new__(_hip.PoolMemory))
    view = pyar.DeviceArray.from_pointer(X, (1000,), F16, owner=pool, device=0)
    assert view.stream_ordered and not array(X).stream_ordered
    with pytest.raises(ValueError, match="stream-ordered pool.*ipc=True"):
        comm.register(view)


# --- foreign arrays -------------------------------------------------------------------

class FakeCupyArray:
    """What the probe reads of a CuPy array."""
    __module__ = "cupy._core.core"

    def __init__(self, ptr, shape=(1000,), dtype=F16):
        self.data = types.SimpleNamespace(ptr=ptr)
        self.shape, self.strides, self.dtype = shape, (dtype.itemsize,), dtype


@pytest.fixture
def fake_cupy(monkeypatch):
    current = types.SimpleNamespace(ptr=0)
    module = types.SimpleNamespace(cuda=types.SimpleNamespace(get_current_stream=lambda: current))
    monkeypatch.setitem(sys.modules, "cupy", module)
    return current


def view_of(obj, stream=None):
    return pyar.DeviceArray.from_pointer(obj.data.ptr, obj.shape, obj.dtype, owner=obj,
                                         device=0)


def test_foreign_arrays_are_recognized_while_unchanged(fake_cupy):
    views = foreign.ForeignViews()
    a = FakeCupyArray(X)
    views.remember(a, view_of(a))
    assert views.lookup(a, 0) == (X, (1000,), F16, 0, False)
    assert views.lookup(FakeCupyArray(X), 0) is None  # another object: parsed afresh
    assert views.lookup(a, 0x1234) is None  # the producer's stream is not the call's
    fake_cupy.ptr = 0x1234
    assert views.lookup(a, 0x1234) is not None
    a.shape = (500, 2)  # CuPy lets a shape be reassigned
    assert views.lookup(a, 0x1234) is None


def test_foreign_entries_hold_no_reference_and_survive_no_address_reuse(fake_cupy):
    views = foreign.ForeignViews()
    a = FakeCupyArray(X)
    views.remember(a, view_of(a))
    address = id(a)
    del a
    for _ in range(100):  # objects made now may land at the old address
        b = FakeCupyArray(Y)
        assert views.lookup(b, 0) is None or id(b) != address
    assert all(entry[0]() is None for entry in views._seen.values())


def test_other_libraries_are_not_remembered():
    views = foreign.ForeignViews()
    other = types.SimpleNamespace(data=types.SimpleNamespace(ptr=X))
    views.remember(other, array(X))
    assert views._seen == {}


def test_a_foreign_array_takes_the_replay(comm, fake_cupy, monkeypatch):
    parsed = []

    def asarray(obj, stream=None):
        parsed.append(obj)
        return view_of(obj)

    monkeypatch.setattr(communicator, "asarray", asarray)
    x, y = FakeCupyArray(X), FakeCupyArray(Y)
    first = comm.allreduce(x, out=y)
    second = comm.allreduce(x, out=y)
    assert parsed == [x, y] and comm.prepared == 1  # not parsed again
    assert Sequence.made[0].runs == [(0, 1, 0)]
    for result in (first, second):
        assert isinstance(result, pyar.DeviceArray)
        assert (result.ptr, result.shape, result.dtype) == (Y, (1000,), F16)
    fake_cupy.ptr = 0x99  # CuPy's current stream moved: ordering is the checks' job
    comm.allreduce(x, out=y)
    assert comm.prepared == 2


def test_a_foreign_arrays_producer_is_ordered_before_the_calls_stream(comm, fake_cupy,
                                                                      monkeypatch):
    """The checks view a foreign input and output for the call's stream, so
    that their producer orders its pending work before the call's kernels
    (``__dlpack__(stream=...)`` through asarray); CuPy's current stream is
    another one here, so every call is checked."""
    asked = []
    monkeypatch.setattr(communicator, "asarray",
                        lambda obj, stream=None: asked.append((obj, stream)) or view_of(obj))
    monkeypatch.setattr(_eager, "stream_is_capturing", lambda handle: False)
    comm.world = 1  # no input table: no stream is asked whether it captures
    x, y = FakeCupyArray(X), FakeCupyArray(Y)
    fake_cupy.ptr = 0x99
    for _ in range(2):
        comm.allreduce(x, out=y, stream=0x5555)
    assert asked == [(x, 0x5555), (y, 0x5555)] * 2 and comm.prepared == 2
    assert comm.copies == [(Y, X, 2000)] * 2


def test_a_foreign_array_moved_under_the_last_call_is_checked(comm, fake_cupy, monkeypatch):
    """The last call's foreign arrays are described again on every call: one
    whose memory moved (as PyTorch's ``set_`` can) takes the checks, and
    its new signature is replayed from then on."""
    monkeypatch.setattr(communicator, "asarray", view_of)
    x, y = FakeCupyArray(X), FakeCupyArray(Y)
    comm.allreduce(x, out=y)
    comm.allreduce(x, out=y)  # the last call now
    y.data = types.SimpleNamespace(ptr=Y + 0x10000)
    assert comm.allreduce(x, out=y).ptr == Y + 0x10000
    assert comm.prepared == 2 and Sequence.made[0].runs == [(0, 1, 0)]
    comm.allreduce(x, out=y)
    assert comm.prepared == 2 and Sequence.made[1].runs == [(0, 3, 0)]


def test_the_last_call_asks_the_current_stream_once_and_probes_each_array(
        comm, fake_cupy, monkeypatch):
    """A call equal to the last one asks the library's current stream once for
    its two CuPy arrays and probes each; a probe that raises sends the call to
    the checks."""
    monkeypatch.setattr(communicator, "asarray", view_of)
    asked = []
    module = sys.modules["cupy"]
    ask = module.cuda.get_current_stream
    monkeypatch.setattr(module.cuda, "get_current_stream", lambda: asked.append(1) or ask())
    x, y = FakeCupyArray(X), FakeCupyArray(Y)
    comm.allreduce(x, out=y)
    comm.allreduce(x, out=y)  # the last call now
    asked.clear()
    comm.allreduce(x, out=y)
    assert len(asked) == 1 and comm.prepared == 1
    x.shape = (500, 2)  # CuPy lets a shape be reassigned: the first array is probed too
    with pytest.raises(ValueError, match=r"expected \(500, 2\)"):
        comm.allreduce(x, out=y)
    x.shape = (1000,)
    comm.allreduce(x, out=y)  # planned before: found by its key
    assert comm.prepared == 2

    def checked(obj, stream=None):
        if not hasattr(obj.data, "ptr"):
            raise TypeError("reported by the checks")
        return view_of(obj)

    monkeypatch.setattr(communicator, "asarray", checked)
    y.data = types.SimpleNamespace()  # the probe raises: the checks report it
    with pytest.raises(TypeError, match="reported by the checks"):
        comm.allreduce(x, out=y)
    assert Sequence.made[0].runs == [(0, 1, 0), (0, 2, 0), (0, 3, 0)]


# --- allreduce_rmsnorm --------------------------------------------------------------

def _fused_call(monkeypatch):
    """A two-rank communicator of tests/test_rmsnorm_cpu.py compiling plans
    into Sequence, and one row of 1000 bf16: (comm, x, residual, weight, out)."""
    from tests import test_rmsnorm_cpu as fused
    comm = fused._comm(world=2)
    comm._node = node_stand_in()
    comm._sequence_type = Sequence
    comm._error_words = None
    monkeypatch.setattr(communicator._hip, "memcpy_dtod", lambda *a, **k: None)
    Sequence.made.clear()
    bf16 = fused.BF16
    x, residual = array(X, dtype=bf16).reshape(1, 1000), array(Y, dtype=bf16).reshape(1, 1000)
    weight = array(0x7200_0000_0000, dtype=bf16)
    out = array(0x7300_0000_0000, dtype=bf16).reshape(1, 1000)
    return comm, x, residual, weight, out


def test_fused_calls_replay_and_return_their_arguments(monkeypatch):
    comm, x, residual, weight, out = _fused_call(monkeypatch)
    first = comm.allreduce_rmsnorm(x, residual, weight, out=out)
    again = comm.allreduce_rmsnorm(x, residual, weight, out=out)
    assert first == again == (out, residual, None, None)
    assert isinstance(again, pyar.comm.rmsnorm.FusedOutputs)
    (plan,) = Sequence.made
    assert plan.runs == [(0, 1, 0)]
    comm.allreduce_rmsnorm(x, residual, weight, eps=1e-5, out=out)  # another eps: planned
    assert len(Sequence.made) == 2
    # out=None allocates a new array per call: checked and planned every time.
    monkeypatch.setattr(communicator.rmsnorm, "empty",
                        lambda shape, dtype, stream=None: pyar.DeviceArray.from_pointer(
                            0x7400_0000_0000, shape, dtype, device=0))
    comm.allreduce_rmsnorm(x, residual, weight)
    comm.allreduce_rmsnorm(x, residual, weight)
    assert len(Sequence.made) == 2


def test_the_last_call_is_replayed_only_while_every_part_is_the_same(monkeypatch):
    """A loop repeats one call, so the last replayed call is compared part by
    part before any key is built: a scalar of another type or value, another
    output, or forgotten plans take their own plan or the checks.  (Freed memory
    under the last call: test_memory_freed_under_a_replayed_array_is_caught.)"""
    comm, x, residual, weight, out = _fused_call(monkeypatch)
    comm.allreduce_rmsnorm(x, residual, weight, eps=1e-5, out=out)
    comm.allreduce_rmsnorm(x, residual, weight, eps=1, out=out)  # an int: checked apart
    comm.allreduce_rmsnorm(x, residual, weight, eps=1e-5, out=out)
    comm.allreduce_rmsnorm(x, residual, weight, eps=1.0, out=out)  # 1.0 is not 1
    comm.allreduce_rmsnorm(x, residual, weight, eps=1, out=out)
    small, one, as_float = Sequence.made
    assert small.runs == [(0, 2, 0)] and one.runs == [(0, 4, 0)] and as_float.runs == []
    comm.allreduce_rmsnorm(x, residual, weight, eps=1.0, out=out)
    assert as_float.runs == [(0, 5, 0)]
    elsewhere = array(0x7500_0000_0000, dtype=x.dtype).reshape(1, 1000)
    comm.allreduce_rmsnorm(x, residual, weight, eps=1.0, out=elsewhere)
    assert len(Sequence.made) == 4 and as_float.runs == [(0, 5, 0)]
    comm.allreduce_rmsnorm(x, residual, weight, eps=1.0, out=out)
    assert as_float.runs == [(0, 5, 0), (0, 7, 0)]
    comm._forget_plans()
    comm.allreduce_rmsnorm(x, residual, weight, eps=1.0, out=out)
    assert len(Sequence.made) == 5 and as_float.runs == [(0, 5, 0), (0, 7, 0)]


def test_unfused_replays_the_allreduce_and_the_row_kernel(monkeypatch):
    """algo="unfused" (what "auto" runs past the fused crossover) is planned
    like the fused variants: the all-reduce kernel with its call-number slot,
    then add_rmsnorm as it is; a replay takes one call number and allocates
    nothing."""
    comm, x, residual, weight, out = _fused_call(monkeypatch)
    comm._module = comm._row_kernels.module
    comm._max_blocks = 16
    first = comm.allreduce_rmsnorm(x, residual, weight, out=out, algo="unfused")
    again = comm.allreduce_rmsnorm(x, residual, weight, out=out, algo="unfused")
    assert first == again == (out, residual, None, None)
    (plan,) = Sequence.made
    functions = comm._row_kernels.module.functions
    algo = algorithms.choose(x.nbytes, 2)
    allreduce = functions[f"pyar_allreduce_{algo.replace('shot', '_shot')}_bf16_w2"]
    add_rmsnorm = functions["pyar_add_rmsnorm_bf16_plain_p1"]
    (a_grid, a_block, a_args, _), = allreduce.launches  # the checked call only
    (b_grid, b_block, b_args, _), = add_rmsnorm.launches
    assert (a_args[2], a_args[3]) == (x.ptr, out.ptr)  # staged by the kernel, summed into out
    assert b_args[0] == out.ptr  # normed in place over the sums
    assert plan.steps == [("kernel", allreduce, a_grid, a_block, (*a_args[:-1], 0), 8, {}),
                          ("kernel", add_rmsnorm, b_grid, b_block, b_args, None, {})]
    assert plan.runs == [(0, 1, 0)] and comm._calls == 2


def test_split_replays_both_kernels_numbering_only_the_first(monkeypatch):
    """Split's plan: per chunk the spinning kernel with its call-number slot,
    then add_rmsnorm packed as it is (no slot, no call number, no entry in
    the call log); a replay takes one call number per call."""
    comm, x, residual, weight, out = _fused_call(monkeypatch)
    first = comm.allreduce_rmsnorm(x, residual, weight, out=out, algo="split")
    again = comm.allreduce_rmsnorm(x, residual, weight, out=out, algo="split")
    assert first == again == (out, residual, None, None)
    (plan,) = Sequence.made
    functions = comm._row_kernels.module.functions
    kernel_a = functions["pyar_allreduce_rmsnorm_split_bf16_p1_w2"]
    kernel_b = functions["pyar_add_rmsnorm_bf16_plain_p1"]
    (a_grid, a_block, a_args, _), = kernel_a.launches  # the checked call only
    (b_grid, b_block, b_args, _), = kernel_b.launches
    assert [step[0] for step in plan.steps] == ["kernel", "kernel"]  # kernel A stages x
    assert plan.steps[0] == ("kernel", kernel_a, a_grid, a_block, (*a_args[:-1], 0), 8, {})
    assert a_args[2] == x.ptr
    assert a_args[-2] == layout.signature("split", 1000, x.dtype, False)
    assert plan.steps[1] == ("kernel", kernel_b, b_grid, b_block, b_args, None, {})
    assert plan.runs == [(0, 1, 0)]
    assert comm._calls == 2
    assert comm._replayed_call(1) == "allreduce_rmsnorm call 1 (split, 1 x 1000 bfloat16)"
