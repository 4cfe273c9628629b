"""The eager hot path without a GPU (tier a): a call whose signature was
planned before is replayed without its checks, and every change the checks
depend on sends it back through them (pyar/comm/_eager.pyx).

The communicator is a real NodeCommunicator assembled over the stand-ins of
tests/comm_stand_ins.py: its kernels record their launches (a staged kernel
copies its input itself), the host's copies of inputs that are not 16-byte
aligned go to a monkeypatched ``memcpy_dtod``, and plans compile into a
RecordingSequence, whose ``run`` calls are the replays.  A call that went
through the checks launches its kernels itself; a replayed one runs its
plan.  Call numbers show as a kernel's last argument and a replay's
``first_call``; how a call is described shows in the CollectiveTimeout a
call raises after a kernel's failure is written into the error record.
Arrays are ``DeviceArray.from_pointer`` on made-up addresses with
``device`` given (no GPU call).
"""
import sys
import types

import numpy as np
import pytest

pytest.importorskip("mpi4py")

import pyar  # noqa: E402
from pyar import _hip  # noqa: E402
from pyar.array import foreign  # noqa: E402
from pyar.comm import algorithms, arguments, exchange, kernels, layout, row_kernels  # noqa: E402
from tests.comm_stand_ins import (  # noqa: E402
    BF16, F16, NodeStandIn, RegistryStandIn, array, assemble, error_record,
)
from tests.comm_stand_ins import capturing, copies, sequences  # noqa: E402,F401 - fixtures
from tests.row_stand_ins import communicator  # noqa: E402

X, Y = 0x7000_0000_0000, 0x7100_0000_0000


@pytest.fixture
def words():
    """The error record the communicator's kernels write."""
    return error_record()


@pytest.fixture
def comm(sequences, copies, words):
    """A communicator of four ranks, this one rank 0, 4096 bytes of scratch."""
    return assemble(world=4, words=words)


def checked(comm):
    """The launches of the calls that went through the checks (a replay
    launches nothing itself): (name, grid, block, args)."""
    return comm.kernels.launches()


def timeout_of(words, number, call, missing=2):
    """The CollectiveTimeout that ``call()`` raises once the kernel of call
    number ``number`` recorded that rank ``missing`` never arrived."""
    words[kernels.FAILED], words[kernels.CALL], words[kernels.MISSING + missing] = 1, number, 1
    with pytest.raises(pyar.CollectiveTimeout) as raised:
        call()
    return raised.value


def test_a_repeated_call_replays_its_plan(comm, sequences, copies):
    x, y = array(X), array(Y)
    assert comm.allreduce(x, out=y) is y
    function = comm.kernels.allreduce("oneshot", F16)
    assert len(checked(comm)) == 1 and len(function.launches) == 1 and copies == []
    (plan,) = sequences
    # Compiled from exactly the steps the checked call ran, call number last: one
    # kernel, which stages x itself.
    (grid, block, args, _), = function.launches
    assert args[2] == X
    assert plan.steps == [("kernel", function, grid, block, (*args[:-1], 0), 8, {})]
    # The signature is fixed per planned step, so the plan carries it as it is.
    assert args[-2] == layout.signature("oneshot", 1000, F16, False)
    for _ in range(3):
        assert comm.allreduce(x, out=y) is y
    assert len(checked(comm)) == 1  # nothing checked again
    assert plan.runs == [(0, 1, 0), (0, 2, 0), (0, 3, 0)]  # call numbers go on
    # A new object over the same memory is the same signature.
    assert comm.allreduce(array(X), out=array(Y)) is not None
    assert len(checked(comm)) == 1 and plan.runs[3:] == [(0, 4, 0)]


@pytest.mark.parametrize("number", [0, 3], ids=["checked", "replayed"])
def test_a_timeout_names_the_call_by_its_number(comm, words, number):
    """The kernels report the number of the call that gave up: call 0 went
    through the checks, call 3 was replayed, and either is described as the
    checked call described it."""
    x, y = array(X), array(Y)
    for _ in range(4):
        comm.allreduce(x, out=y)
    error = timeout_of(words, number, lambda: comm.allreduce(x, out=y))
    assert error.call == f"allreduce call {number} (oneshot, 1000 x float16)"
    assert error.sequence == number and error.missing == (2,)


def test_chunked_calls_replay_every_chunk(comm, sequences):
    count = 2 * comm.max_size // 2 + 100  # two whole chunks and a short one
    x, y = array(X, count), array(Y, count)
    comm.allreduce(x, out=y)
    (plan,) = sequences
    kernel_steps = [s for s in plan.steps if s[0] == "kernel"]
    assert len(kernel_steps) == 3 and len(plan.steps) == 3  # no copies: the kernels stage
    assert [s[4][2] for s in kernel_steps] == [X, X + 4096, X + 8192]
    comm.allreduce(x, out=y)
    comm.allreduce(x, out=y)  # a replay takes a number per chunk
    assert plan.runs == [(0, 3, 0), (0, 6, 0)]


def test_an_unaligned_input_is_copied_before_its_kernel(comm, sequences, copies):
    """The kernels stage whole 16-byte packs: an input that is not 16-byte aligned is
    copied into the scratch by a step of its own, and the kernel stages nothing."""
    x, y = array(X + 2), array(Y)
    comm.allreduce(x, out=y)
    (plan,) = sequences
    assert [s[0] for s in plan.steps] == ["copy", "kernel"]
    assert plan.steps[0][1:4] == (comm.geometry.scratch, X + 2, 2000)
    assert plan.steps[1][4][:3] == (comm.geometry.staged_table, 0, 0)
    assert copies == [(comm.geometry.scratch, X + 2, 2000)]


def test_each_part_of_the_signature_gets_its_own_plan(comm, sequences, capturing):
    x, y = array(X), array(Y)
    comm.allreduce(x, out=y)
    comm.allreduce(x, out=array(Y + 0x10000))           # another output
    comm.allreduce(x, out=y, algo="twoshot")             # another algorithm
    comm.allreduce(x, out=y, stream=0x1234)              # another stream
    comm.allreduce(array(X, 999), out=array(Y, 999))     # another size
    assert len(checked(comm)) == 5 and len(sequences) == 5
    comm.allreduce(x, out=y, stream=0x1234)
    assert len(checked(comm)) == 5 and sequences[3].runs == [(0x1234, 5, 0)]


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


def test_memory_freed_under_a_replayed_array_is_caught(comm, sequences):
    memory = Memory()
    x, y = array(X, owner=memory), array(Y)
    comm.allreduce(x, out=y)
    comm.allreduce(x, out=y)  # replayed, found by the arrays' identity
    assert len(sequences[0].runs) == 1
    memory.closed = True
    with pytest.raises(ValueError, match="was freed"):
        comm.allreduce(x, out=y)
    with pytest.raises(ValueError, match="was freed"):
        comm.allreduce(y, out=x)
    assert len(sequences[0].runs) == 1


def failed_kernel(words, node, comm, call):
    """A kernel timed out and a call read it; the record is cleared, the
    failure stays."""
    timeout_of(words, 0, call, missing=1)
    words[kernels.FAILED] = words[kernels.CALL] = words[kernels.MISSING + 1] = 0
    return pyar.CollectiveTimeout, r"allreduce call 0 \(oneshot"


def failed_host_step(words, node, comm, call):
    node.failure = pyar.CollectiveTimeout("register (host-side exchange)", [1], 0, 1.0)
    return pyar.CollectiveTimeout, "host-side"


def closed(words, node, comm, call):
    comm.close()
    return ValueError, "closed"


@pytest.mark.parametrize("end", [failed_kernel, failed_host_step, closed])
def test_closed_or_failed_communicators_are_not_replayed(sequences, words, end):
    node = NodeStandIn(world=4)
    comm = assemble(world=4, words=words, node=node)
    x, y = array(X), array(Y)
    call = lambda: comm.allreduce(x, out=y)  # noqa: E731
    call()
    error, message = end(words, node, comm, call)
    with pytest.raises(error, match=message):
        call()
    assert sequences[0].runs == []


def test_a_timeout_record_sends_the_call_to_the_checks(comm, sequences, words):
    x, y = array(X), array(Y)
    comm.allreduce(x, out=y)
    comm.allreduce(x, out=y)
    assert len(sequences[0].runs) == 1  # a clear record: replayed
    error = timeout_of(words, 1, lambda: comm.allreduce(x, out=y))
    assert str(error).startswith("allreduce call 1 (oneshot")
    assert len(sequences[0].runs) == 1


def test_debug_checks_every_call(sequences, monkeypatch):
    agreed = []
    agree = exchange.check_agreement
    monkeypatch.setattr(exchange, "check_agreement",
                        lambda node, what, value: agreed.append(value) or agree(node, what, value))
    comm = assemble(world=4, debug=True)
    x, y = array(X), array(Y)
    for _ in range(3):
        comm.allreduce(x, out=y)
    assert len(agreed) == 3 and len(checked(comm)) == 3 and sequences == []


def test_registry_changes_forget_every_plan(sequences):
    registry = RegistryStandIn()
    comm = assemble(world=4, registry=registry)
    x, y = array(X), array(Y)
    comm.allreduce(x, out=y)
    table = 0x5300_0000_0000
    registry.tables[(X, x.nbytes)] = table
    comm.register_graph_buffers()  # the registry changed: x is now read in place
    comm.allreduce(x, out=y)
    assert len(checked(comm)) == 2
    staged, registered = sequences
    assert [s[0] for s in staged.steps] == ["kernel"] and staged.runs == []
    assert staged.steps[0][4][:3] == (comm.geometry.staged_table, 0, X)
    assert [s[0] for s in registered.steps] == ["kernel"]
    assert registered.steps[0][4][:3] == (table, 0, 0)


def test_capturing_streams_are_checked_and_registered(sequences, capturing):
    registry = RegistryStandIn()
    comm = assemble(world=4, registry=registry)
    x, y = array(X), array(Y)
    comm.allreduce(x, out=y, stream=0x1234)
    capturing.add(0x1234)
    comm.allreduce(x, out=y, stream=0x1234)
    assert len(checked(comm)) == 2 and sequences[0].runs == []
    assert registry.deferred == [x]  # the graph reads x in place once handles are exchanged
    capturing.clear()
    comm.allreduce(x, out=y, stream=0x1234)
    assert len(checked(comm)) == 2 and sequences[0].runs == [(0x1234, 2, 0)]


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


def test_a_foreign_array_takes_the_replay(comm, sequences, fake_cupy, monkeypatch):
    parsed = []

    def asarray(obj, stream=None):
        parsed.append(obj)
        return view_of(obj)

    monkeypatch.setattr(arguments, "asarray", asarray)
    x, y = FakeCupyArray(X), FakeCupyArray(Y)
    first = comm.allreduce(x, out=y)
    second = comm.allreduce(x, out=y)
    assert parsed == [x, y] and len(checked(comm)) == 1  # not parsed again
    assert sequences[0].runs == [(0, 1, 0)]
    for result in (first, second):
        assert isinstance(result, pyar.DeviceArray)
        assert (result.ptr, result.shape, result.dtype) == (Y, (1000,), F16)
    fake_cupy.ptr = 0x99  # CuPy's current stream moved: ordering is the checks' job
    comm.allreduce(x, out=y)
    assert len(checked(comm)) == 2


def test_a_foreign_arrays_producer_is_ordered_before_the_calls_stream(
        sequences, copies, capturing, fake_cupy, monkeypatch):
    """The checks view a foreign input and output for the call's stream, so
    that their producer orders its pending work before the call's kernels
    (``__dlpack__(stream=...)`` through asarray); CuPy's current stream is
    another one here, so every call is checked.  A world of one copies x
    into out."""
    asked = []
    monkeypatch.setattr(arguments, "asarray",
                        lambda obj, stream=None: asked.append((obj, stream)) or view_of(obj))
    comm = assemble(world=1)
    x, y = FakeCupyArray(X), FakeCupyArray(Y)
    fake_cupy.ptr = 0x99
    for _ in range(2):
        comm.allreduce(x, out=y, stream=0x5555)
    assert asked == [(x, 0x5555), (y, 0x5555)] * 2
    assert copies == [(Y, X, 2000)] * 2  # both checked: each queued its copy itself


def test_a_foreign_array_moved_under_the_last_call_is_checked(comm, sequences, fake_cupy,
                                                              monkeypatch):
    """The last call's foreign arrays are described again on every call: one
    whose memory moved (as PyTorch's ``set_`` can) takes the checks, and
    its new signature is replayed from then on."""
    monkeypatch.setattr(arguments, "asarray", view_of)
    x, y = FakeCupyArray(X), FakeCupyArray(Y)
    comm.allreduce(x, out=y)
    comm.allreduce(x, out=y)  # the last call now
    y.data = types.SimpleNamespace(ptr=Y + 0x10000)
    assert comm.allreduce(x, out=y).ptr == Y + 0x10000
    assert len(checked(comm)) == 2 and sequences[0].runs == [(0, 1, 0)]
    comm.allreduce(x, out=y)
    assert len(checked(comm)) == 2 and sequences[1].runs == [(0, 3, 0)]


def test_the_last_call_asks_the_current_stream_once_and_probes_each_array(
        comm, sequences, fake_cupy, monkeypatch):
    """A call equal to the last one asks the library's current stream once for
    its two CuPy arrays and probes each; a probe that raises sends the call to
    the checks."""
    monkeypatch.setattr(arguments, "asarray", view_of)
    asked = []
    module = sys.modules["cupy"]
    ask = module.cuda.get_current_stream
    monkeypatch.setattr(module.cuda, "get_current_stream", lambda: asked.append(1) or ask())
    x, y = FakeCupyArray(X), FakeCupyArray(Y)
    comm.allreduce(x, out=y)
    comm.allreduce(x, out=y)  # the last call now
    asked.clear()
    comm.allreduce(x, out=y)
    assert len(asked) == 1 and len(checked(comm)) == 1
    x.shape = (500, 2)  # CuPy lets a shape be reassigned: the first array is probed too
    with pytest.raises(ValueError, match=r"expected \(500, 2\)"):
        comm.allreduce(x, out=y)
    x.shape = (1000,)
    comm.allreduce(x, out=y)  # planned before: found by its key, not checked
    assert len(checked(comm)) == 1

    def parsed(obj, stream=None):
        if not hasattr(obj.data, "ptr"):
            raise TypeError("reported by the checks")
        return view_of(obj)

    monkeypatch.setattr(arguments, "asarray", parsed)
    y.data = types.SimpleNamespace()  # the probe raises: the checks report it
    with pytest.raises(TypeError, match="reported by the checks"):
        comm.allreduce(x, out=y)
    assert sequences[0].runs == [(0, 1, 0), (0, 2, 0), (0, 3, 0)]


# --- allreduce_rmsnorm --------------------------------------------------------------

@pytest.fixture
def fused(sequences, copies, words):
    """A two-rank communicator whose kernels log their launches
    (tests/row_stand_ins.py), and one row of 1000 bf16: (comm, x, residual,
    weight, out, the launch log)."""
    comm, recorded = communicator(world=2, words=words)
    x, residual = array(X, (1, 1000), BF16), array(Y, (1, 1000), BF16)
    weight = array(0x7200_0000_0000, 1000, BF16)
    out = array(0x7300_0000_0000, (1, 1000), BF16)
    return comm, x, residual, weight, out, recorded.log


def test_fused_calls_replay_and_return_their_arguments(fused, sequences, monkeypatch):
    comm, x, residual, weight, out, log = fused
    first = comm.allreduce_rmsnorm(x, residual, weight, out=out)
    again = comm.allreduce_rmsnorm(x, residual, weight, out=out)
    assert first == again == (out, residual, None, None)
    assert isinstance(again, row_kernels.FusedOutputs)
    (plan,) = sequences
    assert plan.runs == [(0, 1, 0)]
    comm.allreduce_rmsnorm(x, residual, weight, eps=1e-5, out=out)  # another eps: planned
    assert len(sequences) == 2
    # out=None allocates a new array per call: checked and planned every time.
    monkeypatch.setattr(arguments, "empty",
                        lambda shape, dtype, stream=None: pyar.DeviceArray.from_pointer(
                            0x7400_0000_0000, shape, dtype, device=0))
    for _ in range(2):
        launched = len(log)
        comm.allreduce_rmsnorm(x, residual, weight)
        assert len(log) > launched  # checked: it launched its kernels itself
    assert len(sequences) == 2


def test_the_last_call_is_replayed_only_while_every_part_is_the_same(fused, sequences):
    """A loop repeats one call, so the last replayed call is compared part by
    part before any key is built: a scalar of another type or value, another
    output, or forgotten plans take their own plan or the checks.  (Freed memory
    under the last call: test_memory_freed_under_a_replayed_array_is_caught.)"""
    comm, x, residual, weight, out, _ = fused
    comm.allreduce_rmsnorm(x, residual, weight, eps=1e-5, out=out)
    comm.allreduce_rmsnorm(x, residual, weight, eps=1, out=out)  # an int: checked apart
    comm.allreduce_rmsnorm(x, residual, weight, eps=1e-5, out=out)
    comm.allreduce_rmsnorm(x, residual, weight, eps=1.0, out=out)  # 1.0 is not 1
    comm.allreduce_rmsnorm(x, residual, weight, eps=1, out=out)
    small, one, as_float = sequences
    assert small.runs == [(0, 2, 0)] and one.runs == [(0, 4, 0)] and as_float.runs == []
    comm.allreduce_rmsnorm(x, residual, weight, eps=1.0, out=out)
    assert as_float.runs == [(0, 5, 0)]
    elsewhere = array(0x7500_0000_0000, (1, 1000), x.dtype)
    comm.allreduce_rmsnorm(x, residual, weight, eps=1.0, out=elsewhere)
    assert len(sequences) == 4 and as_float.runs == [(0, 5, 0)]
    comm.allreduce_rmsnorm(x, residual, weight, eps=1.0, out=out)
    assert as_float.runs == [(0, 5, 0), (0, 7, 0)]
    comm.register_graph_buffers()  # the registry changed: every plan is forgotten
    comm.allreduce_rmsnorm(x, residual, weight, eps=1.0, out=out)
    assert len(sequences) == 5 and as_float.runs == [(0, 5, 0), (0, 7, 0)]


def test_unfused_replays_the_allreduce_and_the_row_kernel(fused, sequences):
    """algo="unfused" (what "auto" runs past the fused crossover) is planned
    like the fused variants: the all-reduce kernel with its call-number slot,
    then add_rmsnorm as it is; a replay takes one call number and allocates
    nothing."""
    comm, x, residual, weight, out, _ = fused
    first = comm.allreduce_rmsnorm(x, residual, weight, out=out, algo="unfused")
    again = comm.allreduce_rmsnorm(x, residual, weight, out=out, algo="unfused")
    assert first == again == (out, residual, None, None)
    (plan,) = sequences
    algo = algorithms.choose(x.nbytes, 2)
    allreduce = comm.kernels.allreduce(algo, BF16)
    add_rmsnorm = comm.kernels.rows.function("pyar_add_rmsnorm_bf16_plain_p1",
                                             kernels.ADD_RMSNORM_ARGS)
    (a_grid, a_block, a_args, _), = allreduce.launches  # the checked call only
    (b_grid, b_block, b_args, _), = add_rmsnorm.launches
    assert (a_args[2], a_args[3]) == (x.ptr, out.ptr)  # staged by the kernel, summed into out
    assert b_args[0] == out.ptr  # normed in place over the sums
    assert plan.steps == [("kernel", allreduce, a_grid, a_block, (*a_args[:-1], 0), 8, {}),
                          ("kernel", add_rmsnorm, b_grid, b_block, b_args, None, {})]
    comm.allreduce_rmsnorm(x, residual, weight, out=out, algo="unfused")
    assert plan.runs == [(0, 1, 0), (0, 2, 0)]


def test_split_replays_both_kernels_numbering_only_the_first(fused, sequences, words):
    """Split's plan: per chunk the spinning kernel with its call-number slot,
    then add_rmsnorm packed as it is (no slot, no call number, no entry in
    the call log); a replay takes one call number per call."""
    comm, x, residual, weight, out, _ = fused
    first = comm.allreduce_rmsnorm(x, residual, weight, out=out, algo="split")
    again = comm.allreduce_rmsnorm(x, residual, weight, out=out, algo="split")
    assert first == again == (out, residual, None, None)
    (plan,) = sequences
    kernel_a = comm.kernels.fused("split", BF16, 0, 1)
    kernel_b = comm.kernels.rows.function("pyar_add_rmsnorm_bf16_plain_p1",
                                          kernels.ADD_RMSNORM_ARGS)
    (a_grid, a_block, a_args, _), = kernel_a.launches  # the checked call only
    (b_grid, b_block, b_args, _), = kernel_b.launches
    assert [step[0] for step in plan.steps] == ["kernel", "kernel"]  # kernel A stages x
    assert plan.steps[0] == ("kernel", kernel_a, a_grid, a_block, (*a_args[:-1], 0), 8, {})
    assert a_args[2] == x.ptr
    assert a_args[-2] == layout.signature("split", 1000, x.dtype, False)
    assert plan.steps[1] == ("kernel", kernel_b, b_grid, b_block, b_args, None, {})
    assert plan.runs == [(0, 1, 0)]
    comm.allreduce_rmsnorm(x, residual, weight, out=out, algo="split")
    assert plan.runs == [(0, 1, 0), (0, 2, 0)]
    error = timeout_of(words, 1, lambda: comm.allreduce_rmsnorm(x, residual, weight, out=out,
                                                                algo="split"), missing=1)
    assert error.call == "allreduce_rmsnorm call 1 (split, 1 x 1000 bfloat16)"
