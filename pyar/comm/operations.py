"""Each collective of a node communicator, described once: how a call's
arguments are checked (``prepare``), what every rank's call must agree on
(``agreement``), the steps it queues (``steps``, from the planner; ``alone``
in a world of one), what it returns, and the key its plan is kept under.

``NodeCommunicator._call`` runs them in one order for every collective:
replay, check, plan, queue, remember (pyar/comm/communicator.py).
"""
import numpy as np

from pyar.comm import algorithms, fused_plan, plan, shards
from pyar.comm.arguments import checked_output, device_array, overlaps
from pyar.comm.kernels import DTYPE_NAMES, FLOAT32, reduce_scatter_outputs
from pyar.comm.plan import Copy, Launch
from pyar.comm.row_kernels import RowCall


def input_array(comm, x, what, stream):
    """``x`` checked as a collective's input on ``comm``'s device."""
    return device_array(x, what, comm.device, stream, dtypes=DTYPE_NAMES, foreign=comm._foreign)


def allreduce_output(comm, x, out, stream):
    """The all-reduce's output: like ``x``; ``x`` itself for in place."""
    given = out
    out = checked_output(out, "out", x.shape, (x.dtype,), comm.device, stream,
                         like=" like the input", foreign=comm._foreign)
    if given is not None and out.ptr != x.ptr and overlaps(out, x):
        raise ValueError("out partially overlaps the input; pass the input itself "
                         "(in place) or a separate array")
    return out


class _ArrayCollective:
    """A collective of one input ``x`` into one output ``out``: its plan is
    keyed by (x, out) as given and the other arguments (``rest``)."""
    registered = None

    def __init__(self, x, out, rest):
        self.key_arrays = (x, out)
        self.key_rest = rest
        self._given_out = out

    @property
    def empty(self):
        return self.x.size == 0

    def alone(self, comm):
        """A world of one: the input is the sum."""
        x, out = self.x, self.out
        return [Copy(out.ptr, x.ptr, x.nbytes)] if out.ptr != x.ptr else []

    def result(self):
        return self.out

    def replayable(self, world):
        return True

    def plan_output(self):
        """(fresh, out_dtype, returns) of the plan: a new output's shape,
        dtype, size and address range, which each replay replaces."""
        out = self.out
        fresh = None if self._given_out is not None else (
            out.shape, out.dtype, out.nbytes, (out.ptr, out.ptr + out.nbytes))
        return fresh, out.dtype, ()


class AllReduce(_ArrayCollective):
    kind = "allreduce"
    what = "all-reduce (elements, dtype, algorithm, registered input)"

    def __init__(self, x, out, algo):
        super().__init__(x, out, (algo,))
        self.x, self.out, self.algo = x, out, algo

    def prepare(self, comm, stream):
        algorithms.validate(self.algo)
        x = self.x = input_array(comm, self.x, "x", stream)
        self.out = allreduce_output(comm, x, self.out, stream)
        if comm.world > 1 and x.size:
            if self.algo not in algorithms.LL_ALGORITHMS:  # LL: no peer reads x
                self.registered = comm._input_table(x, stream)
            # Refuses what a forced LL cannot take.
            self.algo = plan.allreduce_algorithm(comm.geometry, x, self.out, self.algo,
                                                 self.registered is not None)
        elif self.algo in algorithms.LL_ALGORITHMS:  # refused alike where nothing is planned
            refusal = plan.ll_refusal(self.algo, plan.ll_segment(comm.max_size), comm.world,
                                      x, self.out)
            if refusal:
                raise ValueError(f"algo={self.algo!r} {refusal}")

    def agreement(self):
        return (self.x.size, str(self.x.dtype), self.algo, self.registered is not None)

    def steps(self, comm):
        return plan.allreduce(comm.geometry, comm.kernels, self.x, self.out, self.algo,
                              self.registered)


class ReduceScatter(_ArrayCollective):
    kind = "reduce_scatter"
    what = "reduce_scatter (elements, dtype, output dtype, registered input)"

    def __init__(self, x, out):
        super().__init__(x, out, ())
        self.x, self.out = x, out

    def prepare(self, comm, stream):
        x = self.x = input_array(comm, self.x, "x", stream)
        length = shards.length(x.size, comm.world, x.dtype.itemsize, comm.rank)
        dtypes = reduce_scatter_outputs(x.dtype)
        if comm.world == 1 and x.dtype != FLOAT32:
            dtypes = (x.dtype,)  # no widening kernel runs in a world of one
        out = self.out = checked_output(self.out, "out", (length,), dtypes, comm.device, stream,
                                        like=f" (this rank's shard of {x.size} elements)",
                                        foreign=comm._foreign)
        if overlaps(out, x):
            raise ValueError("out overlaps the input x; reduce_scatter needs a separate "
                             "array")
        if comm.world > 1 and x.size:
            self.registered = comm._input_table(x, stream)

    def agreement(self):
        return (self.x.size, str(self.x.dtype), str(self.out.dtype), self.registered is not None)

    def steps(self, comm):
        return plan.reduce_scatter(comm.geometry, comm.kernels, self.x, self.out,
                                   self.registered)


class AllGather(_ArrayCollective):
    kind = "all_gather"
    what = "all_gather (elements, dtype, registered input)"

    def __init__(self, x, out, n):
        super().__init__(x, out, (n,))
        self.x, self.out, self.n = x, out, n

    @property
    def empty(self):
        return self.out.size == 0

    def prepare(self, comm, stream):
        x = self.x = input_array(comm, self.x, "x", stream)
        itemsize, world, n, out = x.dtype.itemsize, comm.world, self.n, self.out
        if n is None:
            if out is None:
                raise TypeError("all_gather needs out= or n= (the whole array's element "
                                "count), which the shard lengths do not tell")
            out = input_array(comm, out, "out", stream)
            n = out.size
        elif isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"n must be a non-negative int, got {n!r}")
        n = int(n)
        start, end = shards.bounds(n, world, itemsize, comm.rank)
        if x.size != end - start:
            raise ValueError(
                f"x has {x.size} elements; rank {comm.rank}'s shard of {n} elements on "
                f"{world} ranks has {end - start} (elements {start}..{end}: shards of "
                f"{shards.shard_size(n, world, itemsize)} in rank order, the last "
                "shorter or empty)")
        out = self.out = checked_output(out, "out", (n,), (x.dtype,), comm.device, stream,
                                        any_shape=True, foreign=comm._foreign)
        if x.size and out.ptr + start * itemsize != x.ptr and overlaps(out, x):
            raise ValueError(f"out overlaps the input x; pass a separate array or, in "
                             f"place, x at this rank's shard of out ({start * itemsize} "
                             "bytes in)")
        even = n == world * shards.shard_size(n, world, itemsize)
        if world > 1 and n and even:  # uneven shards: buffers differ in size, so staged
            self.registered = comm._input_table(x, stream)

    def agreement(self):
        return (self.out.size, str(self.x.dtype), self.registered is not None)

    def steps(self, comm):
        return plan.all_gather(comm.geometry, comm.kernels, self.x, self.out, self.registered)


class AllReduceRMSNorm:
    """allreduce_rmsnorm: its plan is keyed by its seven arrays as given
    (x, residual, weight, out, residual_out, quantized, scales) and its
    scalars, and kept only when every output is one of them."""
    kind = "allreduce_rmsnorm"
    what = ("allreduce_rmsnorm (tokens, hidden, dtype, quantization, algorithm, "
            "registered input)")
    registered = None

    def __init__(self, arrays, scalars):
        self.key_arrays, self.key_rest = arrays, scalars
        self.algo = scalars[-1]

    def prepare(self, comm, stream):
        algorithms.validate_fused(self.algo)
        self._stream = stream
        rows = comm._rows()
        x, residual, weight, out, residual_out, quantized, scales = self.key_arrays
        eps, quant, group_size, fp8_dtype, _ = self.key_rest
        call = self.call = RowCall(x, residual, weight, eps, out, residual_out, quant,
                                   group_size, fp8_dtype, quantized, scales, stream,
                                   comm.device, rows.layout)
        row_bytes = call.hidden * call.x.dtype.itemsize
        if row_bytes > comm.max_size:
            raise ValueError(f"a row of {row_bytes} bytes does not fit the communicator's "
                             f"scratch buffer (max_size {comm.max_size})")
        lamport_bytes = fused_plan.lamport_segment(comm.max_size)
        if self.algo == algorithms.LAMPORT:  # refused alike at every world size
            refusal = fused_plan.lamport_refusal(rows.layout, lamport_bytes, call.x.nbytes,
                                                 row_bytes)
            if refusal:
                raise ValueError(f"algo='lamport' {refusal}")
        if comm.world == 1 or call.tokens == 0:
            return
        if self.algo == "auto":
            self.algo = fused_plan.variant(comm.geometry, rows.layout, call.x.nbytes,
                                           row_bytes)
        if self.algo != algorithms.LAMPORT:  # lamport: peers never read x
            self.registered = comm._input_table(call.x, stream)

    def agreement(self):
        return (*self.call.agreement_key(), self.algo, self.registered is not None)

    @property
    def empty(self):
        return self.call.tokens == 0

    def alone(self, comm):
        """A world of one: add + RMSNorm (+ quantization) of the input."""
        call = self.call
        return [Launch(*comm._rows().add_rmsnorm_launch(call, call.x.ptr, 0, call.tokens,
                                                        comm._local_blocks()))]

    def steps(self, comm):
        call = self.call
        sums = None
        if self.algo == algorithms.UNFUSED and call.out is None:
            sums = comm._sums_like(call.x, self._stream)
        return fused_plan.allreduce_rmsnorm(comm.geometry, comm.kernels, call, self.algo,
                                            self.registered, sums)

    def result(self):
        return self.call.outputs()

    def replayable(self, world):
        """Kept only when every output is an argument (a new array per call
        would need its own allocation and address in the plan), and never in
        a world of one."""
        return world > 1 and None not in self._returns()

    def _returns(self):
        arrays = self.key_arrays
        return tuple(-1 if a is None else next((i for i, b in enumerate(arrays) if b is a), None)
                     for a in self.call.outputs())

    def plan_output(self):
        return None, None, self._returns()
