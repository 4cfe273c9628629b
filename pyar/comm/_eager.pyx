# cython: language_level=3
"""The eager hot path of a Communicator: a call whose signature was seen
before replays the launches planned for it.

The first call of a signature runs every check and plans its launches (the
planner's Copy and Launch records, pyar/comm/plan.py); ``_remember`` compiles them
into a ``LaunchSequence`` with the arguments packed once.  A later call with
the same signature -- the same input and output memory (address, shape,
dtype, device, read-only), algorithm and stream -- finds the plan by that key
and queues it: what the checks looked at is in the key, so they would pass
again.  A call equal to the last one found, part by part (the same array
objects, a foreign one still described as before; the same stream and scalar
values of the same types), takes its plan without building a key.  Only the
call numbers (patched per call) and a fresh output's address change between
replays.

A signature is not replayed, but checked and planned again, when anything
else the checks depend on may have changed: the communicator is closed,
failed or debugging (PYAR_DEBUG checks every call across ranks), a kernel
failed (timed out, or found that the ranks' calls disagree), the stream is
capturing (captures register their inputs), an array's memory was freed, a
foreign array moved or its library's current stream is not the call's; and
every plan is forgotten when the buffer registry changes (``_forget_plans``).

A planned kernel's arguments include its call signature (layout.signature),
which the plan key fixes: the same arrays, algorithm and registry give the
same signature.
"""
import weakref

from libc.stdint cimport uint32_t, uintptr_t

DEF CALL_LOG = 4096  # replayed calls remembered for timeout reports

from pyar._hip import (
    DeviceMemory, IpcMapping, LaunchSequence, PoolMemory, Stream, as_stream,
    stream_is_capturing, stream_ordered_memory,
)
from pyar.array import DeviceArray
from pyar.array.foreign import ForeignViews
from pyar.comm.plan import Copy

PLAN_LIMIT = 4096  # signatures remembered before the cache starts over
_POINTER_KINDS = ("ptr", "pointer")
_OWNERS = (DeviceMemory, PoolMemory, IpcMapping)
_CHEAP_SCALARS = frozenset((str, int, float))
# Plan keys name dtypes by id; the dtypes of every plan stay alive here, so
# an id is never another dtype's (a handful of objects, most immortal anyway).
_KEYED_DTYPES = set()


cdef class Plan:
    """One signature's launches and how to produce its result."""
    cdef readonly object sequence   # LaunchSequence: run(stream, first_call, out)
    cdef readonly list descriptions # (kind, details) of each numbered launch
    cdef readonly object fresh      # (shape, dtype, nbytes) of a new output, or None
    cdef readonly object out_dtype  # the given output's dtype (for a view of it)
    cdef readonly tuple returns     # allreduce_rmsnorm: which argument each output is

    def __init__(self, sequence, descriptions, fresh=None, out_dtype=None, returns=()):
        self.sequence = sequence
        self.descriptions = descriptions
        self.fresh = fresh
        self.out_dtype = out_dtype
        self.returns = returns


cdef tuple typed(tuple scalars):
    """The scalar arguments as plan-key parts, each with its type (128 and
    128.0, or 1 and True, were checked differently), or None when one cannot
    be a key: such a call takes the checked path, which says what is wrong."""
    try:
        hash(scalars)
    except TypeError:
        return None
    return tuple([(type(v), v) for v in scalars])


cdef bint same_scalars(tuple given, tuple last):
    """Whether two calls' scalar arguments would give equal ``typed`` keys,
    as far as telling costs no more than a comparison: each pair is one
    object, or equal values of one type among str, int and float."""
    cdef Py_ssize_t i
    if len(given) != len(last):
        return False
    for i in range(len(given)):
        a = given[i]
        b = last[i]
        if a is b:
            continue
        if type(a) is not type(b) or type(a) not in _CHEAP_SCALARS or not a == b:
            return False
    return True


cdef inline object stream_key(stream):
    """The handle of ``stream`` when it can be read without converting it, else None."""
    if stream is None:
        return 0
    if type(stream) is Stream:
        return None if stream.closed else stream.handle
    if type(stream) is int and stream >= 0:
        return stream
    return None


cdef class PlanCache:
    """The plans of the signatures seen before, and the state the hot path
    reads at C level; NodeCommunicator derives from it."""
    cdef public bint _closed
    cdef public object _failure
    cdef public object _node  # the node's bounded host exchange; its failure ends replays
    cdef public bint debug
    cdef public int world
    cdef public unsigned long long _calls
    cdef public object _call_log
    cdef list _replayed                      # call number % CALL_LOG -> (kind, details)
    cdef unsigned long long _replayed_numbers[CALL_LOG]
    cdef public uintptr_t _error_ptr   # host-visible error record, 0 until allocated
    cdef public object _sequence_type  # what plans are compiled into
    cdef readonly dict _plans
    cdef dict _by_identity  # (kind, stream, rest, ids) -> (array refs, plan, key)
    cdef readonly object _foreign
    # The last call found through _by_identity, compared field by field
    # before any key is built: a loop repeats one call.
    cdef tuple _last  # (kind, handle, scalars as given, array refs, plan, key), or None

    def __cinit__(self, *args, **kwargs):
        self._plans = {}
        self._by_identity = {}
        self._foreign = ForeignViews()
        self._sequence_type = LaunchSequence
        self._replayed = [None] * CALL_LOG

    def _forget_plans(self):
        """Plan every signature afresh (the registry or the state changed)."""
        self._plans.clear()
        self._by_identity.clear()
        self._foreign.clear()
        self._last = None

    cdef inline bint _replayable(self):
        if (self._closed or self._failure is not None or self.debug
                or self._node.failure is not None):
            return False
        return self._error_ptr == 0 or (<uint32_t*>self._error_ptr)[0] == 0

    cdef object _replay_handle(self, stream):
        """The stream handle of a call that may replay or be planned, else None."""
        if not self._replayable():
            return None
        handle = stream_key(stream)
        if handle is None or (handle and stream_is_capturing(handle)):
            return None
        return handle

    cdef object _describe(self, a, uintptr_t stream):
        """The key of an array argument: (address, shape, dtype, device,
        read-only), or None when it must go through the full checks.  The
        key names the dtype by id: the plan holds the dtype itself."""
        if type(a) is DeviceArray:
            if not self._unfreed(a):
                return None  # the checks raise: the memory was freed
            device = a._device
            if device is None:
                return None  # looked up by the checks, once
            return (a._ptr, a._shape, id(a._dtype), device, a._readonly)
        if a is None:
            return None
        found = self._foreign.lookup(a, stream)
        if found is None:
            return None
        ptr, shape, dtype, device, readonly = found
        return (ptr, shape, id(dtype), device, readonly)

    cdef object _key(self, str kind, tuple arrays, tuple rest, uintptr_t handle):
        """The plan key of a call, or None when it cannot be replayed."""
        cdef list parts = [kind, handle]
        for a in arrays:
            if a is None:
                parts.append(None)
                continue
            d = self._describe(a, handle)
            if d is None:
                return None
            parts.append(d)
        return (*parts, *rest)

    cdef _run(self, Plan plan, uintptr_t handle, uintptr_t out):
        cdef unsigned long long first = self._calls
        cdef unsigned long long number
        cdef Py_ssize_t i, slot
        plan.sequence.run(handle, first & 0xFFFFFFFF, out)
        for i in range(len(plan.descriptions)):
            number = first + i
            slot = (number & 0xFFFFFFFF) % CALL_LOG
            self._replayed[slot] = plan.descriptions[i]
            self._replayed_numbers[slot] = number
        self._calls = first + len(plan.descriptions)

    def _replayed_call(self, uint32_t call):
        """How the replayed call with kernel call number ``call`` is described
        in a timeout report; None when the last call with it was checked."""
        cdef Py_ssize_t slot = call % CALL_LOG
        entry = self._replayed[slot]
        if entry is None:
            return None
        kind, details = entry
        return f"{kind} call {self._replayed_numbers[slot]} {details}"

    def _checked_call(self, uint32_t call):
        """A checked call took number ``call``: the call log describes it."""
        self._replayed[call % CALL_LOG] = None

    cdef tuple _lookup(self, str kind, tuple arrays, tuple rest, stream):
        """(plan, key, stream handle) of a call planned before, else None.

        Found first as the last call found, part by part; then by the
        identity of the pyar arrays of a call seen before: a DeviceArray's
        memory, shape, dtype and device never change, so only its memory's
        being freed must be checked again; else by the arrays' descriptions
        (``_describe``)."""
        cdef list ids
        h = self._replay_handle(stream)
        if h is None:
            return None
        last = self._last
        if (last is not None and kind == last[0] and h == last[1]
                and same_scalars(rest, last[2]) and self._same_arrays(last[3], arrays, h)):
            return last[4], last[5], h
        given = rest
        rest = typed(rest)
        if rest is None:
            return None
        ids = [kind, h, rest]
        for a in arrays:
            ids.append(id(a))
        identity = tuple(ids)
        seen = self._by_identity.get(identity)
        if seen is not None and self._same_arrays(seen[0], arrays, h):
            self._last = (kind, h, given, *seen)
            return seen[1], seen[2], h
        key = self._key(kind, arrays, rest, h)
        if key is None:
            return None
        plan = self._plans.get(key)
        if plan is None:
            return None
        refs = []
        foreign = False
        for a in arrays:
            if a is None or type(a) is DeviceArray:
                refs.append(None if a is None else weakref.ref(a))
            else:  # probed again on every call: it may have moved
                foreign = True
                refs.append(self._foreign.mark(a))
        seen = (tuple(refs), plan, key)
        if not foreign:
            if len(self._by_identity) >= PLAN_LIMIT:
                self._by_identity.clear()
            self._by_identity[identity] = seen
        self._last = (kind, h, given, *seen)
        return plan, key, h

    cdef bint _same_arrays(self, tuple refs, tuple arrays, uintptr_t handle):
        """Whether ``arrays`` are the objects ``refs`` name: a pyar array's
        memory not freed, a foreign array probed as before (its library may
        have moved it) and its library's current stream the call's, asked
        once a call for each library and device (an empty array may live on
        another device than the call's)."""
        cdef Py_ssize_t i
        asked = asked_device = None
        for i in range(len(arrays)):
            a = arrays[i]
            ref = refs[i]
            if a is None:
                if ref is not None:
                    return False
            elif type(ref) is tuple:  # ForeignViews.mark
                try:
                    if ref[0]() is not a or ref[1](a) != ref[2]:
                        return False
                    if ref[3] is not asked or ref[4] != asked_device:
                        if ref[3](a) != handle:
                            return False
                        asked, asked_device = ref[3], ref[4]
                except Exception:  # noqa: BLE001 - the checked path reports what is wrong
                    return False
            elif ref is None or ref() is not a or not self._unfreed(a):
                return False
        return True

    cdef inline bint _unfreed(self, a):
        owner = a._owner
        return not (isinstance(owner, _OWNERS) and owner.closed)

    def _replay_allreduce(self, x, out, algo, stream):
        """``out`` (or a new array) with the planned launches queued, when
        this signature was planned before; else None."""
        return self._replay_into("allreduce", x, out, (algo,), stream)

    def _replay_shards(self, str kind, x, out, tuple rest, stream):
        """The same for reduce_scatter and all_gather (``kind``), whose other
        arguments are ``rest``."""
        return self._replay_into(kind, x, out, rest, stream)

    cdef object _replay_into(self, str kind, x, out, tuple rest, stream):
        cdef Plan plan
        found = self._lookup(kind, (x, out), rest, stream)
        if found is None:
            return None
        plan, key, handle = found
        if plan.fresh is not None:
            if handle and type(stream) is not Stream:
                return None
            shape, dtype, nbytes = plan.fresh
            memory = stream_ordered_memory(nbytes, as_stream(stream))  # as Communicator._output
            result = DeviceArray._make(memory.ptr, shape, dtype, memory, memory.device,
                                       stream if handle else None, False)
            self._run(plan, handle, memory.ptr)
            return result
        self._run(plan, handle, 0)
        if type(out) is DeviceArray:
            return out
        ptr, shape, _, device, readonly = key[3]
        return DeviceArray._make(ptr, shape, plan.out_dtype, out, device, None, readonly)

    def _replay_rmsnorm(self, tuple arrays, tuple scalars, stream):
        """(out, residual_out, quantized, scales) of a planned
        allreduce_rmsnorm signature, its launches queued; else None.
        ``arrays``: (x, residual, weight, out, residual_out, quantized, scales)."""
        cdef Plan plan
        for a in arrays:
            if a is not None and type(a) is not DeviceArray:
                return None
        found = self._lookup("allreduce_rmsnorm", arrays, scalars, stream)
        if found is None:
            return None
        plan, _, handle = found
        self._run(plan, handle, 0)
        return tuple([None if i < 0 else arrays[i] for i in plan.returns])

    def _remember(self, str kind, tuple arrays, tuple rest, stream, list steps, fresh=None,
                  out_dtype=None, returns=()):
        """Compile the steps a checked call ran (plan.Copy and plan.Launch
        records; a spinning kernel's call number follows its ``args``) into
        the plan of its signature.  ``fresh``: (shape, dtype, nbytes,
        (start, end)) of the output the call allocated, whose address each
        replay replaces."""
        cdef uintptr_t handle
        h = self._replay_handle(stream)
        if h is None:
            return
        handle = h
        rest = typed(rest)
        if rest is None:
            return
        key = self._key(kind, arrays, rest, handle)
        if key is None:
            return
        start, end = (0, 0) if fresh is None else fresh[3]
        sequence = self._sequence_type()
        descriptions = []
        for step in steps:
            if type(step) is Copy:
                sequence.add_copy(step.dst, step.src, step.nbytes,
                                  out_offset=step.dst - start if start <= step.dst < end else None)
                continue
            function, args = step.function, step.args
            moved = {i: a - start for i, a in enumerate(args)
                     if start <= a < end and function.argtypes[i] in _POINTER_KINDS}
            if step.kind is None:
                sequence.add_kernel(function, step.grid, step.block, args, out_args=moved)
                continue
            sequence.add_kernel(function, step.grid, step.block, (*args, 0), call_arg=len(args),
                                out_args=moved)
            descriptions.append((step.kind, step.details))
        for a in arrays:
            if a is not None:
                _KEYED_DTYPES.add(a._dtype if type(a) is DeviceArray
                                  else self._foreign.lookup(a, handle)[2])
        if len(self._plans) >= PLAN_LIMIT:
            self._plans.clear()
        self._plans[key] = Plan(sequence, descriptions,
                                None if fresh is None else fresh[:3], out_dtype, returns)
