"""Ranks that disagree on a call, without PYAR_DEBUG: the kernels' start barrier
compares every rank's call signature (docs/design.md, Call signatures and MismatchError)
and nobody reads a peer's data, hangs or gets a silently wrong result.

main  For each case, on a fresh Communicator(timeout=TIMEOUT, debug=False),
      the last rank makes a call that differs from the others' in one way:
        elements             4096 against 4097 elements (all-reduce, two-shot)
        elements-far         4096 against 2**20 + 3 (chunked there: other grids too)
        chunks               2**20 against 2**21 elements, a call of two chunks of 2**20
                             (the 4 MiB scratch): its first launch has the others' count,
                             and only "more chunks follow" tells them apart
        dtype                float32 against float16
        algorithm            two-shot against one-shot
        ll-elements          LL 4096 against 4097 elements
        ll-algorithm         two-shot against LL
        ll_twoshot-elements  LL two-shot 4096 against 4097 elements
        ll_twoshot-algorithm LL against LL two-shot
        registered           a registered input against a staged one
        quantization         allreduce_rmsnorm one-stage without and with FP8
        split-rows           allreduce_rmsnorm split, 4 rows against 5: kernel A records
                             the disagreement, and kernel B (which waits for no peer)
                             must write nothing either, y nor the residual in place
        operation            allreduce against reduce_scatter
      Every output is filled with NaN bytes beforehand.  Required on every
      rank: synchronize() raises pyar.MismatchError before the timeout,
      naming every rank's call as the host encoded it ("rank 0: allreduce
      twoshot 4096 x float32 staged; ..."); every output is still NaN and
      every input unchanged (nothing of a peer was read, nothing written);
      later calls raise it again; close() returns.  At the end a new
      communicator sums exactly.
control PATH
      The elements and dtype cases against kernels built with
      PYAR_TEST_IGNORE_SIGNATURE (the comparison compiled out): reports
      whether MismatchError was raised and whether any output changed; never
      fails for them (the test asserts that the ranks went ahead and wrote).

Usage: call_mismatch.py main | control PATH
"""
import time

import ml_dtypes
import numpy as np
from mpi4py import MPI

import pyar
from pyar import _hip
from pyar.comm import shards
from allreduce_common import NAN_BYTE, bits, run

TIMEOUT = 5.0       # seconds; a mismatch must be reported well before it
CLOSE_SLACK = 10.0
N = 4096
TOKENS, HIDDEN = 4, 1024
BF16 = np.dtype(ml_dtypes.bfloat16)
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)


def sentinel(shape, dtype, stream, ipc=False):
    a = pyar.empty(shape, dtype, stream=stream, ipc=ipc)
    _hip.memset(a.ptr, NAN_BYTE, a.nbytes, stream)
    return a


def filled(values, stream, ipc=False):
    a = pyar.empty(values.shape, values.dtype, stream=stream, ipc=ipc)
    a.set(values, stream=stream)
    return a


def allreduce_case(n_last=N, dtype_last=np.float32, algo_last="twoshot", n=N, algo="twoshot"):
    """An all-reduce case: the last rank's count, dtype or algorithm differs
    from the others' (``n`` float32 elements by ``algo``)."""
    def prepare(sc, comm, stream):
        last = sc.rank == sc.world - 1
        count, dtype = (n_last, dtype_last) if last else (n, np.float32)
        x = filled(np.ones(count, dtype), stream)
        y = sentinel((count,), dtype, stream)
        how = algo_last if last else algo
        return lambda: comm.allreduce(x, out=y, algo=how, stream=stream), [x], [y]
    return prepare


def registered(sc, comm, stream):
    x = filled(np.ones(N, np.float32), stream, ipc=True)
    comm.register(x)  # collective, every rank
    if sc.rank == sc.world - 1:
        x = filled(np.ones(N, np.float32), stream, ipc=True)  # not registered: staged
    y = sentinel((N,), np.float32, stream)
    return lambda: comm.allreduce(x, out=y, algo="twoshot", stream=stream), [x], [y]


def quantization(sc, comm, stream):
    rng = np.random.default_rng(sc.rank)
    x = filled(rng.standard_normal((TOKENS, HIDDEN), np.float32).astype(BF16), stream)
    residual = filled(rng.standard_normal((TOKENS, HIDDEN), np.float32).astype(BF16), stream)
    weight = filled(np.ones(HIDDEN, BF16), stream)
    if sc.rank == sc.world - 1:
        quantized = sentinel((TOKENS, HIDDEN), FP8, stream)
        scales = sentinel((TOKENS, 1), np.float32, stream)
        return (lambda: comm.allreduce_rmsnorm(
            x, residual, weight, stream=stream, quant="fp8_per_token", fp8_dtype=FP8,
            quantized=quantized, scales=scales, algo="onestage"),
            [x, residual, weight], [quantized, scales])
    out = sentinel((TOKENS, HIDDEN), BF16, stream)
    return (lambda: comm.allreduce_rmsnorm(x, residual, weight, out=out, stream=stream,
                                           algo="onestage"),
            [x, residual, weight], [out])


def split_rows(sc, comm, stream):
    rng = np.random.default_rng(sc.rank)
    tokens = TOKENS + (sc.rank == sc.world - 1)
    x = filled(rng.standard_normal((tokens, HIDDEN), np.float32).astype(BF16), stream)
    residual = filled(rng.standard_normal((tokens, HIDDEN), np.float32).astype(BF16), stream)
    weight = filled(np.ones(HIDDEN, BF16), stream)
    out = sentinel((tokens, HIDDEN), BF16, stream)
    return (lambda: comm.allreduce_rmsnorm(x, residual, weight, out=out, stream=stream,
                                           algo="split"),
            [x, residual, weight], [out])


def operation(sc, comm, stream):
    x = filled(np.ones(N, np.float32), stream)
    if sc.rank == sc.world - 1:
        y = sentinel((shards.length(N, sc.world, 4, sc.rank),), np.float32, stream)
        return lambda: comm.reduce_scatter(x, out=y, stream=stream), [x], [y]
    y = sentinel((N,), np.float32, stream)
    return lambda: comm.allreduce(x, out=y, algo="twoshot", stream=stream), [x], [y]


STAGED_4096 = "allreduce twoshot 4096 x float32 staged"
# case -> (prepare, the others' call, the last rank's call) as the error names them
CASES = {
    "elements": (allreduce_case(n_last=N + 1), STAGED_4096,
                 "allreduce twoshot 4097 x float32 staged"),
    # 2**20 + 3 float32 on a 4 MiB scratch: the first chunk has 2**20 elements
    "elements-far": (allreduce_case(n_last=(1 << 20) + 3), STAGED_4096,
                     "allreduce twoshot 1048576 x float32 staged "
                     "(a chunk; more of the call follow)"),
    "chunks": (allreduce_case(n=1 << 20, n_last=1 << 21),
               "allreduce twoshot 1048576 x float32 staged",
               "allreduce twoshot 1048576 x float32 staged (a chunk; more of the call follow)"),
    "dtype": (allreduce_case(dtype_last=np.float16), STAGED_4096,
              "allreduce twoshot 4096 x float16 staged"),
    "algorithm": (allreduce_case(algo_last="oneshot"), STAGED_4096,
                  "allreduce oneshot 4096 x float32 staged"),
    "ll-elements": (allreduce_case(n_last=N + 1, algo="ll", algo_last="ll"),
                    "allreduce ll 4096 x float32 unstaged",
                    "allreduce ll 4097 x float32 unstaged"),
    "ll-algorithm": (allreduce_case(algo_last="ll"), STAGED_4096,
                     "allreduce ll 4096 x float32 unstaged"),
    "ll_twoshot-elements": (allreduce_case(n_last=N + 1, algo="ll_twoshot",
                                           algo_last="ll_twoshot"),
                            "allreduce ll_twoshot 4096 x float32 unstaged",
                            "allreduce ll_twoshot 4097 x float32 unstaged"),
    "ll_twoshot-algorithm": (allreduce_case(algo="ll", algo_last="ll_twoshot"),
                             "allreduce ll 4096 x float32 unstaged",
                             "allreduce ll_twoshot 4096 x float32 unstaged"),
    "registered": (registered, "allreduce twoshot 4096 x float32 registered",
                   STAGED_4096),
    "quantization": (quantization,
                     f"allreduce_rmsnorm onestage {TOKENS * HIDDEN} x bfloat16 staged, "
                     "no quantization",
                     f"allreduce_rmsnorm onestage {TOKENS * HIDDEN} x bfloat16 staged, "
                     "fp8 quantization"),
    "split-rows": (split_rows,
                   f"allreduce_rmsnorm split {TOKENS * HIDDEN} x bfloat16 staged, "
                   "no quantization",
                   f"allreduce_rmsnorm split {(TOKENS + 1) * HIDDEN} x bfloat16 staged, "
                   "no quantization"),
    "operation": (operation, STAGED_4096,
                  "reduce_scatter 4096 x float32 staged, float32 output"),
}
CONTROL_CASES = ("elements", "dtype")


def host_bits(arrays, stream):
    return [bits(a.get(stream=stream)).copy() for a in arrays]


def one_case(sc, name, kernels_path=None):
    prepare, others, odd = CASES[name]
    control = kernels_path is not None
    kwargs = {} if kernels_path is None else {"kernels": kernels_path}
    comm = pyar.Communicator(MPI.COMM_WORLD, max_size=4 << 20, timeout=TIMEOUT, debug=False,
                             **kwargs)
    stream = pyar.Stream()
    call, inputs, outputs = prepare(sc, comm, stream)
    stream.synchronize()
    before_in, before_out = host_bits(inputs, stream), host_bits(outputs, stream)
    sc.mpi.Barrier()
    started = time.monotonic()
    error = None
    try:
        call()
        comm.synchronize(stream)
    except pyar.MismatchError as exc:
        error = exc
    except pyar.CollectiveTimeout as exc:
        if not control:
            sc.check(False, f"{name}: CollectiveTimeout instead of MismatchError: {exc}")
    elapsed = time.monotonic() - started
    stream.synchronize()
    changed_in = sum(not np.array_equal(a, b)
                     for a, b in zip(before_in, host_bits(inputs, stream)))
    changed_out = sum(not np.array_equal(a, b)
                      for a, b in zip(before_out, host_bits(outputs, stream)))
    if not control:
        sc.check(error is not None, f"{name}: no MismatchError")
        sc.check(changed_out == 0, f"{name}: {changed_out} output(s) were written")
        sc.check(changed_in == 0, f"{name}: {changed_in} input(s) changed")
        sc.check(elapsed < TIMEOUT, f"{name}: reported after {elapsed:.2f} s, not before "
                                    f"the {TIMEOUT} s timeout")
    if error is not None and not control:
        text = str(error)
        for r in range(sc.world):
            want = f"rank {r}: {odd if r == sc.world - 1 else others}"
            sc.check(want in text, f"{name}: {text!r} lacks {want!r}")
        sc.check(f"on rank {sc.rank}" in text, f"{name}: {text!r} does not name rank {sc.rank}")
        sc.expect_raises(pyar.MismatchError, call, f"{name}: a call after the mismatch")
        sc.expect_raises(pyar.MismatchError, lambda: comm.synchronize(stream),
                         f"{name}: synchronize after the mismatch")
    closing = time.monotonic()
    comm.close()
    closed = time.monotonic() - closing
    sc.check(closed < 2 * TIMEOUT + CLOSE_SLACK, f"{name}: close() took {closed:.2f} s")
    sc.report(test="call-mismatch-control" if control else "call-mismatch", case=name,
              raised=sc.sum(error is not None), outputs_written=sc.sum(changed_out),
              inputs_changed=sc.sum(changed_in), elapsed=round(sc.max(elapsed), 3),
              close_seconds=round(sc.max(closed), 3), timeout=TIMEOUT)


def still_sums(sc):
    """After the failures a new communicator on the same GPU sums exactly."""
    comm = pyar.Communicator(MPI.COMM_WORLD, timeout=TIMEOUT, debug=False)
    stream = pyar.Stream()
    x = filled(np.full(N + 3, sc.rank + 1, np.float32), stream)
    y = comm.allreduce(x, stream=stream)
    comm.synchronize(stream)
    want = np.full(N + 3, sc.world * (sc.world + 1) // 2, np.float32)
    ok = sc.check(np.array_equal(y.get(stream=stream), want), "the new communicator's sum")
    comm.close()
    sc.report(test="call-mismatch-after", wrong=sc.world - sc.sum(ok))


def main(sc):
    mode = sc.argv[0] if sc.argv else "main"
    if mode == "main":
        for name in CASES:
            one_case(sc, name)
        still_sums(sc)
    elif mode == "control":
        for name in CONTROL_CASES:
            one_case(sc, name, sc.argv[1])
    else:
        raise SystemExit(f"unknown mode {mode!r}: main | control PATH")


if __name__ == "__main__":
    run("call_mismatch", main)
