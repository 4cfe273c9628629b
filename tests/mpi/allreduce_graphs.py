"""All-reduce inside captured graphs: the inference-server pattern.

replay [PATH]   A graph of K steps [producer copies a fresh input into the one
                input slot x][on some ranks a delay][all-reduce x -> y_k]
                [consumer overwrites x with NaN, its end first] -- the next step reuses the
                slot, exactly where the seeds' bug struck -- replayed REPLAYS
                times with random per-rank delays before each replay and, on
                random ranks, spin kernels on a second stream that take SMs
                away from the replay while it runs; every y_k checked exactly.  x is never
                registered eagerly: the capture records it and
                comm.capture()'s exit exchanges its handle.  With PATH (a code
                object built without the exit barrier) this is the positive
                control: one-shot, mismatches reported, never failed for.
                Without PATH the LL one-shot and two-shot are replayed too,
                LL_REPLAYS times each at the largest slot it takes at this
                world size.
lagged PATH     replay's checked configurations with PATH's kernels (a build
                whose rank 1 lags after the start barrier, exit barrier in
                place): every y_k exact.
serve           Several graphs for different token counts (like a server's
                batch sizes) captured one after another, sharing one input
                pointer at different sizes, replayed in random order with
                eager staged calls interleaved; every result checked against
                a float64 reference.  Then ranks that capture in different
                orders get MismatchError, not wrong sums.
"""
import time

import numpy as np
from mpi4py import MPI

import pyar
from pyar import _hip
from allreduce_common import (
    ALGOS, DTYPES, LL_ALGOS, NAN_WORD, bits, describe_difference, exact_sum, ll_bytes, normal,
    rng, run, small_integers,
)
from tests.gpu_kernels import GpuTestKernels

K = 8                  # all-reduces per graph, all through one input slot
REPLAYS = 125          # K * REPLAYS = 1000 calls per configuration
PATTERNS = 4
SLOT_BYTES = 256 << 10
LL_REPLAYS = 50        # K * LL_REPLAYS = 400 calls per (dtype, LL algorithm)
# The control's (slot bytes, noise) by world size; noise is (p, us, blocks per SM) of
# the spin kernels.  At 4 and 8 ranks an 8 MiB slot and heavy noise find a wrong sum in
# 8-1432 calls on the H200.  At 2 ranks sharing a GPU each rank has one block a
# multiprocessor and both read at one pace: with the heavy noise no wrong sum in 144480
# calls (1 MiB), 25008 (8 MiB) or 1992 (64 MiB); with one noise block a multiprocessor,
# 1 MiB and the end of the slot overwritten first, one in 73360 calls once and none in
# 161480 the next time.  So the 2-rank control runs a build whose rank 1 lags after
# the start barrier (tests/gpu/test_graph_allreduce_gpu.py).
CONTROL = {2: (1 << 20, (0.8, 200, 1))}
CONTROL_OTHER_WORLDS = (8 << 20, (0.8, 500, 16))
NOISE = (0.3, 200, 1)  # the test's
TAIL_BYTES = 12        # not a whole 16-byte pack; a multiple of 4 for fill_u32
CONSUMER_END_BYTES = 2 << 20  # more than one pass of the largest grid (132 x 512 x 16 B)
CONTROL_SECONDS = 90
STEP_DELAY_US = 100    # captured per (rank, step) with probability 1/2


def slot_graph(sc, comm, kernels, stream, dtype, algo, key, slot_bytes):
    """Builds the K-step graph; returns (graph, patterns, expected, sources, outs)."""
    n = slot_bytes // dtype.itemsize + TAIL_BYTES // dtype.itemsize
    nbytes = n * dtype.itemsize
    mine = [small_integers(dtype, n, *key, sc.rank, j) for j in range(PATTERNS)]
    expected = [bits(exact_sum([small_integers(dtype, n, *key, r, j) for r in range(sc.world)],
                               dtype)) for j in range(PATTERNS)]
    patterns = [pyar.asarray(p, stream=stream) for p in mine]
    sources = [pyar.empty((n,), dtype, stream=stream) for _ in range(K)]
    outs = [pyar.empty((n,), dtype, stream=stream) for _ in range(K)]
    x = pyar.empty((n,), dtype, stream=stream)
    delays = rng(*key, 13, sc.rank)
    stream.synchronize()
    with comm.capture(stream) as graph:
        for k in range(K):
            _hip.memcpy_dtod(x.ptr, sources[k].ptr, nbytes, stream)
            if delays.random() < 0.5:
                kernels.spin(delays.uniform(0, STEP_DELAY_US), stream)
            comm.allreduce(x, out=outs[k], algo=algo, stream=stream)
            # A peer's blocks stride over x and read its end last, so the end is
            # overwritten first: a peer lagging this rank by the gap between two graph
            # nodes is caught, not only one lagging by the time to fill the slot.
            end = min(nbytes, CONSUMER_END_BYTES)
            kernels.fill_u32(x.ptr + nbytes - end, NAN_WORD, end // 4, stream)
            kernels.fill_u32(x.ptr, NAN_WORD, nbytes // 4, stream)
    return graph, patterns, expected, sources, outs, x


def replay_config(sc, comm, kernels, streams, dtype, algo, key, deadline=None):
    control = deadline is not None
    stream, noise_stream = streams
    if control:
        slot_bytes, noise = CONTROL.get(sc.world, CONTROL_OTHER_WORLDS)
    elif algo in LL_ALGOS:  # with the tail, the most it takes
        slot_bytes, noise = ll_bytes(algo, sc.world) - 16, NOISE
    else:
        slot_bytes, noise = SLOT_BYTES, NOISE
    graph, patterns, expected, sources, outs, x = slot_graph(
        sc, comm, kernels, stream, dtype, algo, key, slot_bytes)
    noise_p, noise_us, noise_per_sm = noise
    sms = pyar.Device(comm.device).multiprocessor_count
    shared = rng(*key, 7)             # same on every rank: which pattern each step gets
    local = rng(*key, 11, sc.rank)    # this rank's delays
    nbytes = x.nbytes
    calls = wrong = 0
    details = 0
    for _ in range(LL_REPLAYS if algo in LL_ALGOS else REPLAYS):
        chosen = [int(j) for j in shared.integers(PATTERNS, size=K)]
        for k, j in enumerate(chosen):
            _hip.memcpy_dtod(sources[k].ptr, patterns[j].ptr, nbytes, stream)
            kernels.fill_u32(outs[k].ptr, NAN_WORD, nbytes // 4, stream)
        if local.random() < 0.5:
            kernels.spin(local.uniform(0, 200), stream)
        if local.random() < noise_p:
            noise_stream.wait(stream)  # the noise starts with the replay
            kernels.spin(local.uniform(0, noise_us), noise_stream, blocks=sms * noise_per_sm)
        graph.replay(stream)
        comm.synchronize(stream)
        noise_stream.synchronize()
        for k, j in enumerate(chosen):
            got = outs[k].get(stream=stream)
            if not np.array_equal(bits(got), expected[j]):
                wrong += 1
                if details < 3:
                    details += 1
                    sc.log(f"{dtype.name} {algo} step {k}: "
                           f"{describe_difference(got, expected[j].view(dtype))}")
        calls += K
        if control and (sc.any(wrong) or sc.max(time.monotonic()) > deadline):
            break
    graph.close()
    return calls, sc.sum(wrong)


def replay_mode(sc, kernels_path=None, control=False):
    kwargs = {} if kernels_path is None else {"kernels": kernels_path}
    comm = pyar.Communicator(MPI.COMM_WORLD, timeout=60.0, **kwargs)
    kernels = GpuTestKernels(comm.device)
    streams = (pyar.Stream(), pyar.Stream())
    if not control:
        test = "graph-replay" if kernels_path is None else "graph-lagged"
        for d, dtype in enumerate(DTYPES):
            # LL has no start barrier for the lagged build to delay after.
            for a, algo in enumerate(ALGOS + (() if kernels_path else LL_ALGOS)):
                calls, wrong = replay_config(sc, comm, kernels, streams, dtype, algo, (d, a))
                sc.check(wrong == 0, f"{dtype.name} {algo}: {wrong} of {calls} graph "
                                     "results were wrong")
                sc.report(test=test, algo=algo, dtype=dtype.name, calls=calls,
                          mismatches=wrong)
    else:
        deadline = time.monotonic() + CONTROL_SECONDS
        found = calls = attempt = 0
        while not found and sc.max(time.monotonic()) <= deadline:
            d = attempt % len(DTYPES)
            c, wrong = replay_config(sc, comm, kernels, streams, DTYPES[d], "oneshot",
                                     (d, 9, attempt), deadline)
            calls += c
            found += wrong
            attempt += 1
        sc.report(test="graph-control", algo="oneshot", calls=calls, mismatches=found)
    comm.close()


def serve_mode(sc):
    comm = pyar.Communicator(MPI.COMM_WORLD, timeout=60.0)
    stream = pyar.Stream()
    hidden = 1024
    tokens = (1, 3, 16, 64, 200)
    dtype = np.dtype(DTYPES[2])
    # One input buffer, as a server reuses its activation buffer, captured at
    # several sizes; one output per batch size.
    x = pyar.empty((max(tokens) * hidden,), dtype, stream=stream)
    outs = {t: pyar.empty((t * hidden,), dtype, stream=stream) for t in tokens}
    graphs = {}
    for t in tokens:
        view = pyar.DeviceArray.from_pointer(x.ptr, (t * hidden,), dtype, owner=x,
                                             device=x.device)
        with comm.capture(stream) as graph:
            comm.allreduce(view, out=outs[t], stream=stream)
        graphs[t] = graph
    order = rng(5).permutation(np.repeat(tokens, 20))
    local_eager = pyar.empty((4096 + 5,), dtype, stream=stream)
    eager_out = pyar.empty_like(local_eager)
    checked = wrong = 0
    for i, t in enumerate(order):
        t = int(t)
        inputs = [normal(dtype, t * hidden, 1, i, r) for r in range(sc.world)]
        ref = np.sum([a.astype(np.float64) for a in inputs], axis=0)
        view = pyar.DeviceArray.from_pointer(x.ptr, (t * hidden,), dtype, owner=x,
                                             device=x.device)
        view.set(inputs[sc.rank], stream=stream)
        graphs[t].replay(stream)
        if i % 3 == 0:  # an eager, staged call between replays
            eager_in = [normal(dtype, local_eager.size, 2, i, r) for r in range(sc.world)]
            local_eager.set(eager_in[sc.rank], stream=stream)
            comm.allreduce(local_eager, out=eager_out, stream=stream)
            eager_ref = np.sum([a.astype(np.float64) for a in eager_in], axis=0)
        comm.synchronize(stream)
        for got, want in [(outs[t].get(stream=stream), ref)] + (
                [(eager_out.get(stream=stream), eager_ref)] if i % 3 == 0 else []):
            error = np.abs(got.astype(np.float64) - want).max() / (np.abs(want).max() or 1)
            checked += 1
            if not sc.check(error < 2e-2 * sc.world, f"tokens {t}: relative error {error:.3g}"):
                wrong += 1
    for graph in graphs.values():
        graph.close()
    sc.report(test="graph-serving", dtype=dtype.name, calls=len(order), checked=checked,
              mismatches=sc.sum(wrong))

    # Ranks that capture in different orders: a clear error on every rank.
    # hipMalloc memory, read in place by the graphs (pool memory would be staged).
    a = pyar.empty((4096,), dtype, stream=stream, ipc=True)
    b = pyar.empty((8192,), dtype, stream=stream, ipc=True)
    outs_ab = (pyar.empty_like(a), pyar.empty_like(b))
    first, second = ((a, outs_ab[0]), (b, outs_ab[1]))
    if sc.rank % 2:
        first, second = second, first

    def capture_out_of_order():
        with comm.capture(stream):
            comm.allreduce(first[0], out=first[1], stream=stream)
            comm.allreduce(second[0], out=second[1], stream=stream)

    raised = sc.expect_raises(pyar.MismatchError, capture_out_of_order,
                              "capturing in different orders", contains=("capture order",))
    sc.report(test="graph-order-mismatch", ranks_raised=sc.sum(raised is not None),
              mismatches=0)

    # A graph that outlives its communicator is closed with it: replaying it
    # raises instead of reading freed and unmapped memory.
    with comm.capture(stream) as kept:
        comm.allreduce(a, out=outs_ab[0], stream=stream)
    executable = kept.executable
    kept.replay(stream)
    comm.synchronize(stream)
    comm.close()
    stale = [sc.expect_raises(ValueError, lambda: kept.replay(stream),
                              "replaying a graph after comm.close()", contains=("closed",)),
             sc.expect_raises(ValueError, lambda: executable.launch(stream),
                              "launching its executable after comm.close()",
                              contains=("destroyed",))]
    sc.report(test="graph-after-close", ranks_raised=sc.sum(all(e is not None for e in stale)),
              mismatches=0)


def main(sc):
    mode = sc.argv[0] if sc.argv else "replay"
    if mode == "replay":
        path = sc.argv[1] if len(sc.argv) > 1 else None
        replay_mode(sc, path, control=path is not None)
    elif mode == "lagged":
        replay_mode(sc, sc.argv[1])
    elif mode == "serve":
        serve_mode(sc)
    else:
        raise SystemExit(f"unknown mode {mode!r}: replay [PATH] | lagged PATH | serve")


if __name__ == "__main__":
    run("allreduce_graphs", main)
