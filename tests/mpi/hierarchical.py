"""The hierarchical all-reduce on real ranks, nodes simulated by node_size
(every rank on GPU 0 under MPS on the one-GPU machine):
tests/gpu/test_hierarchical_gpu.py runs it.

Modes:
  sums K [K...]  For each node size K in turn (one launch covers several
                 shapes, e.g. 8 ranks: 2x4 then 4x2): pyar.Communicator(...,
                 node_size=K) must be a HierarchicalCommunicator; random
                 per-rank inputs against the float64 sum of every rank's
                 input, fp32/fp16/bf16, counts 1, 7, 4095 and 40001 (past
                 the 64 KiB scratch: chunked inside a piece), staged out of
                 place and registered in place, and fp32 1M+3 once; pieces
                 of 4096 elements per rank, so most calls run several pieces
                 through the double-buffered pipeline; every rank's result
                 bitwise identical.  The fused call (allreduce_rmsnorm) in
                 fp32 and bf16 against float64, bitwise identical across
                 ranks.  A call under graph capture, and comm.capture(),
                 raise CaptureError.
  paths K [K...]  For each node size K: the inter-node data paths side by
                 side, under a GPU-aware MPI (tests/gpu/
                 test_hierarchical_device_gpu.py launches it so):
                 pyar.Communicator(..., node_size=K) must take "device" by
                 itself ("auto"), a second one is told inter_node="host",
                 rail_method="allgather"; random per-rank inputs in every
                 dtype, counts 1, 7, 4095, 40001 and 1M+3: the device path's
                 result within tolerance of float64, bitwise identical on
                 every rank and bitwise equal to the host path's; 40001 also
                 registered in place on the device path, the same bits.
  timeout K      node_size=K, timeout 2 s: the last rank (last node) skips a
                 call.  Its node's other ranks raise CollectiveTimeout (its
                 kernel's wait) naming it in the caller's ranks; the other
                 nodes' ranks raise CollectiveTimeout (their inter-node
                 step's wait); all within the timeout + slack, and again at
                 once on the next call; then every rank closes.

Every row names the inter-node data path taken ($PYAR_INTER_NODE chooses it
for sums and timeout).

Usage: hierarchical.py sums K [K ...] | paths K [K ...] | timeout K
"""
import hashlib
import time

import ml_dtypes
import numpy as np
from mpi4py import MPI

import pyar
from pyar.comm import hierarchical
from allreduce_common import DTYPES, bits, normal, run

COUNTS = (1, 7, 4095, 40001)
BIG = (1 << 20) + 3
# Of the sum of |inputs| per element: float32 additions, then one rounding.
TOLERANCE = {"float32": 1e-6, "float16": 1e-3, "bfloat16": 8e-3}
TIMEOUT = 2.0
SLACK = 10.0
EPS = 1e-6


def identical(sc, array, what):
    """Whether every rank holds the same bits (checked, counted)."""
    digest = hashlib.sha256(bits(array).tobytes()).hexdigest()
    same = len(set(sc.mpi.allgather(digest))) == 1
    sc.check(same, f"{what}: ranks hold different bits")
    return same


def inputs(sc, dtype, n, rank, key):
    return normal(dtype, n, 41, key, rank, n)


def reference(sc, dtype, n, key):
    """The float64 sum of every rank's input, and the sum of their magnitudes."""
    total, magnitude = np.zeros(n, np.float64), np.zeros(n, np.float64)
    for r in range(sc.world):
        x = inputs(sc, dtype, n, r, key).astype(np.float64)
        total += x
        magnitude += np.abs(x)
    return total, magnitude


def close_enough(sc, got, want, scale, dtype, what):
    """|got - want| within the dtype's tolerance of ``scale``, element by element."""
    error = np.abs(got.astype(np.float64) - want) - TOLERANCE[np.dtype(dtype).name] * scale
    worst = int(np.argmax(error))
    return sc.check(error[worst] <= 0, f"{what}: element {worst} is {float(got[worst])!r}, "
                                       f"float64 says {want[worst]!r}")


def sums(sc, node_size):
    hierarchical.PIECE_SHARD_ELEMENTS = 4096
    comm = pyar.Communicator(MPI.COMM_WORLD, max_size=64 << 10, timeout=60.0,
                             node_size=node_size)
    shape = f"{sc.world // node_size}x{node_size}"
    if not sc.check(isinstance(comm, hierarchical.HierarchicalCommunicator),
                    f"{shape}: Communicator() gave {type(comm).__name__}"):
        return
    sc.check((comm.world, comm.rank, comm.local.world, comm.domains) ==
             (sc.world, sc.rank, node_size, sc.world // node_size),
             f"{shape}: {comm!r}")
    stream = pyar.Stream()
    calls = wrong = 0
    for dtype in DTYPES:
        for n in COUNTS + ((BIG,) if dtype == np.float32 else ()):
            key = 10 * n + node_size
            host = inputs(sc, dtype, n, sc.rank, key)
            want, scale = reference(sc, dtype, n, key)
            x = pyar.asarray(host, stream=stream)
            y = comm.allreduce(x, stream=stream)
            comm.synchronize(stream)
            got = y.get(stream=stream)
            what = f"{shape} {dtype} n={n} staged"
            wrong += not close_enough(sc, got, want, scale, dtype, what)
            wrong += not identical(sc, got, what)
            sc.check(np.array_equal(bits(x.get(stream=stream)), bits(host)),
                     f"{what}: the input changed")
            calls += 1
            if n in (7, 40001):  # registered, in place: the same bits
                shared = pyar.empty((n,), dtype, ipc=True)
                shared.set(host, stream=stream)
                comm.register(shared)
                comm.allreduce(shared, out=shared, stream=stream)
                comm.synchronize(stream)
                sc.check(np.array_equal(bits(shared.get(stream=stream)), bits(got)),
                         f"{shape} {dtype} n={n}: registered in place differs from staged")
                calls += 1
    fused_calls = fused(sc, comm, stream, shape)
    captured(sc, comm, stream, shape)
    stream.close()
    comm.close()
    sc.report(test="hierarchical", shape=shape, calls=calls, mismatches=sc.sum(wrong),
              fused_calls=fused_calls, piece_shard=4096, inter_node=comm.inter_node)


def paths(sc, node_size):
    hierarchical.PIECE_SHARD_ELEMENTS = 4096
    shape = f"{sc.world // node_size}x{node_size}"
    made = dict(max_size=64 << 10, timeout=60.0, node_size=node_size)
    device = pyar.Communicator(MPI.COMM_WORLD, **made)
    host = pyar.Communicator(MPI.COMM_WORLD, inter_node="host", rail_method="allgather", **made)
    sc.check((device.inter_node, device.gpu_aware_mpi, host.inter_node) ==
             ("device", True, "host"),
             f"{shape}: paths {device.inter_node!r} (GPU-aware: {device.gpu_aware_mpi}) and "
             f"{host.inter_node!r}")
    stream = pyar.Stream()
    calls = wrong = differ = 0
    for dtype in DTYPES:
        for n in COUNTS + (BIG,):
            key = 10 * n + node_size + 3
            data = inputs(sc, dtype, n, sc.rank, key)
            want, scale = reference(sc, dtype, n, key)
            x = pyar.asarray(data, stream=stream)
            got = device.allreduce(x, stream=stream).get(stream=stream)
            staged = host.allreduce(x, stream=stream).get(stream=stream)
            what = f"{shape} {dtype} n={n}"
            wrong += not close_enough(sc, got, want, scale, dtype, f"{what} device path")
            wrong += not identical(sc, got, f"{what} device path")
            differ += not sc.check(np.array_equal(bits(got), bits(staged)),
                                   f"{what}: the device path's bits differ from the host's")
            calls += 2
            if n == 40001:
                shared = pyar.empty((n,), dtype, ipc=True)
                shared.set(data, stream=stream)
                device.register(shared)
                device.allreduce(shared, out=shared, stream=stream)
                sc.check(np.array_equal(bits(shared.get(stream=stream)), bits(got)),
                         f"{what}: registered in place differs on the device path")
                device.unregister(shared)
                calls += 1
    stream.close()
    device.close()
    host.close()
    sc.report(test="hierarchical-paths", shape=shape, calls=calls, mismatches=sc.sum(wrong),
              path_differences=sc.sum(differ), inter_node=device.inter_node)


def fused(sc, comm, stream, shape):
    tokens, hidden = 5, 512
    calls = 0
    for dtype in (np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16)):
        key = 7 + hidden
        host = inputs(sc, dtype, tokens * hidden, sc.rank, key).reshape(tokens, hidden)
        s64, scale = (a.reshape(tokens, hidden) for a in reference(sc, dtype, tokens * hidden, key))
        residual = normal(dtype, tokens * hidden, 43).reshape(tokens, hidden)
        weight = normal(dtype, hidden, 44)
        x = pyar.asarray(host, stream=stream)
        res = pyar.asarray(residual, stream=stream)
        w = pyar.asarray(weight, stream=stream)
        outputs = comm.allreduce_rmsnorm(x, res, w, EPS, stream=stream)
        comm.synchronize(stream)
        y = outputs.out.get(stream=stream)
        r = outputs.residual_out.get(stream=stream)
        r64 = s64 + residual.astype(np.float64)
        what = f"{shape} fused {dtype}"
        close_enough(sc, r.ravel(), r64.ravel(), (scale + np.abs(residual)).ravel(), dtype,
                     f"{what} residual_out")
        stored = r.astype(np.float64)
        y64 = stored / np.sqrt(np.mean(stored * stored, axis=-1, keepdims=True) + EPS) \
            * weight.astype(np.float64)
        close_enough(sc, y.ravel(), y64.ravel(), np.abs(y64).ravel(), dtype, f"{what} y")
        identical(sc, y, f"{what} y")
        identical(sc, r, f"{what} residual_out")
        calls += 1
    return calls


def captured(sc, comm, stream, shape):
    x = pyar.asarray(np.ones(64, np.float32), stream=stream)
    comm.synchronize(stream)

    def under_capture():
        with pyar.capture(stream):
            comm.allreduce(x, stream=stream)

    sc.expect_raises(hierarchical.CaptureError, under_capture, f"{shape}: a captured call",
                     contains=("cannot be captured", "MPI"))
    sc.expect_raises(hierarchical.CaptureError, lambda: comm.capture(stream),
                     f"{shape}: comm.capture()", contains=("cannot be captured",))
    y = comm.allreduce(x, stream=stream)  # the communicator still works
    comm.synchronize(stream)
    sc.check(np.array_equal(y.get(stream=stream), np.full(64, sc.world, np.float32)),
             f"{shape}: wrong sum after the refused capture")


def timeout(sc, node_size):
    last = sc.world - 1
    comm = pyar.Communicator(MPI.COMM_WORLD, max_size=1 << 20, timeout=TIMEOUT,
                             node_size=node_size)
    stream = pyar.Stream()
    n = 65536 + 3
    x = pyar.asarray(np.ones(n, np.float32), stream=stream)
    y = comm.allreduce(x, stream=stream)
    comm.synchronize(stream)
    sc.check(np.array_equal(y.get(stream=stream), np.full(n, sc.world, np.float32)),
             "wrong sum before the timeout")
    sc.mpi.Barrier()
    elapsed = None
    same_node = sc.rank // node_size == last // node_size
    if sc.rank != last:
        started = time.monotonic()
        error = sc.expect_raises(pyar.CollectiveTimeout, lambda: (
            comm.allreduce(x, out=y, stream=stream), comm.synchronize(stream)),
            f"rank {last} skipped a call", contains=("allreduce",))
        elapsed = time.monotonic() - started
        if error is not None:
            sc.check(error.rank == sc.rank, f".rank {error.rank} != {sc.rank}")
            if same_node:
                sc.check(error.missing == (last,), f"same node: .missing {error.missing}")
            else:
                sc.check("inter-node step" in str(error), f"other node: {error}")
            sc.check(TIMEOUT * 0.9 <= elapsed < TIMEOUT + SLACK,
                     f"raised after {elapsed:.2f} s with a {TIMEOUT} s timeout")
            again = sc.expect_raises(pyar.CollectiveTimeout,
                                     lambda: comm.allreduce(x, out=y, stream=stream),
                                     "a call after the timeout")
            sc.check(again is None or str(again) == str(error), "another error the next time")
    comm.close()
    sc.check(comm.closed, "not closed after close()")
    raised = sc.sum(elapsed is not None)
    sc.report(test="hierarchical-timeout", shape=f"{sc.world // node_size}x{node_size}",
              inter_node=comm.inter_node, timeout=TIMEOUT, elapsed=round(sc.max(elapsed or 0.0), 3), skipped_rank=last,
              raised=raised, expected=sc.world - 1)


def main(sc):
    mode, sizes = sc.argv[0], [int(k) for k in sc.argv[1:]]
    for node_size in sizes:
        {"sums": sums, "paths": paths, "timeout": timeout}[mode](sc, node_size)


if __name__ == "__main__":
    run("hierarchical", main)
