"""Soak: every kind of call in random order for a while, every result
checked, and nothing growing.

For $PYAR_SOAK_SECONDS seconds (default 20; 600 on request), at 4 ranks on a
Communicator(max_size=1 MiB), each step draws (the same on every rank) one of:
- all-reduce, eager, staged: 1 to 3 scratch sizes + 5 elements (chunked),
  fp32/fp16/bf16, one-shot/two-shot/auto, out new, given or in place;
- all-reduce, eager, registered: a buffer registered at the start (3 sizes a
  dtype), refilled, out given or in place;
- all-reduce_rmsnorm, eager, staged: 1-64 tokens of hidden 512/2880/4096,
  one-stage/two-stage/split/auto/unfused, no quantization, FP8 per token or
  per group, or MXFP4; residual in place or not;
- all-reduce_rmsnorm, eager, registered rows;
- a replay of one of 21 graphs captured at the start (all-reduce: 3 dtypes x
  one-shot/two-shot x staged/registered; fused: 3 dtypes x one-stage/
  two-stage/split), refilled with new data first;
- now and then: a new buffer registered, all-reduced, unregistered, freed;
and before it each rank may delay its stream (a spin kernel of up to 0.5 ms,
p = 0.3) or itself (a host sleep of up to 2 ms, p = 0.05).  Every input is
random per rank and step; every result is checked against the float64
reference of all ranks' inputs (all-reduce: tests/mpi/checked_sums.py; fused:
rmsnorm_fused_common.py's bounds).

Flat: after a warm-up that makes every kind of call once at its largest
size (and captures the graphs), and again at the end, each rank synchronizes
and samples the GPU's free memory (the runtime's), its open file
descriptors and its resident memory.  Run with PYAR_POOL_RELEASE_THRESHOLD=0
(the GPU test sets it) so that the pool hands freed memory back and the free
memory means something.  Allowed growth: DEVICE_MIB of the GPU's memory
(all ranks together), FDS descriptors and RSS_MIB of resident memory a rank.

Prints one row: calls, wrong results, calls by kind, the three deltas.

Usage: soak.py
"""
import collections
import gc
import os
import time

import numpy as np
from mpi4py import MPI

import pyar
from pyar import _hip
from allreduce_common import DTYPES, rng, run
from buffer_lifetime import registrable
from checked_sums import RandomSum
from rmsnorm_fused_common import EPS, FP8, KINDS, Checker, group_size, host, random_inputs
from tests.gpu_kernels import GpuTestKernels

MAX_SIZE = 1 << 20
ALGOS = ("oneshot", "twoshot", "auto")
FUSED_ALGOS = ("onestage", "twostage", "split", "auto", "unfused")
HIDDEN = (512, 2880, 4096)
REGISTERED_ROWS = ((8, 4096), (64, 2880))
GRAPH_N = 65536 + 3
GRAPH_ROWS = (16, 4096)
DEVICE_MIB = 64
FDS = 4
RSS_MIB = 64
STEPS = ("eager-staged", "eager-registered", "fused-staged", "fused-registered",
         "graph", "register-cycle")
WEIGHTS = (0.3, 0.15, 0.2, 0.1, 0.22, 0.03)
WARM_UP_STEPS = 1 << 40


def largest(dtype):
    return 3 * (MAX_SIZE // dtype.itemsize) + 5


def registered_sizes(dtype):
    return (1000, GRAPH_N, largest(dtype))


def sample(sc):
    """(free device bytes, open descriptors, resident bytes) of this rank,
    every rank idle (synchronized, its pool trimmed) before any measures."""
    _hip.device_synchronize()
    gc.collect()
    sc.mpi.Barrier()
    free, _ = pyar.Device(pyar.get_device()).memory_info()
    with open("/proc/self/statm") as f:
        resident = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    descriptors = len(os.listdir("/proc/self/fd"))
    sc.mpi.Barrier()
    return free, descriptors, resident


class Soak:
    def __init__(self, sc):
        self.sc = sc
        self.comm = pyar.Communicator(MPI.COMM_WORLD, max_size=MAX_SIZE, timeout=60.0)
        self.kernels = GpuTestKernels(self.comm.device)
        self.stream = pyar.Stream()
        self.fused = Checker(sc)
        self.wrong = 0
        self.calls = collections.Counter()
        self.registered = {}
        self.graphs = []

    # --- one call of each kind ------------------------------------------------------

    def expect(self, y, data, what):
        self.comm.synchronize(self.stream)
        bad = data.wrong(y.get(stream=self.stream))
        self.sc.check(bad == 0, f"{what}: {bad} of {y.size} elements beyond the bound")
        self.wrong += bad > 0

    def delay(self, step):
        r = rng(self.sc.rank, step, 7)
        if r.random() < 0.3:
            self.kernels.spin(int(r.integers(1, 500)), stream=self.stream)
        if r.random() < 0.05:
            time.sleep(0.002 * r.random())

    def eager_staged(self, step, r, dtype, n=None):
        n = n or int(np.exp(r.uniform(0, np.log(largest(dtype)))))
        algo = ALGOS[r.integers(len(ALGOS))]
        placement = ("new", "given", "in place")[r.integers(3)]
        data = RandomSum(dtype, n, self.sc.rank, self.sc.world, step)
        x = pyar.asarray(data.mine, stream=self.stream)
        out = {"new": None, "given": pyar.empty((n,), dtype, stream=self.stream),
               "in place": x}[placement]
        self.delay(step)
        y = self.comm.allreduce(x, out=out, algo=algo, stream=self.stream)
        self.expect(y, data, f"step {step}: staged {n} x {dtype.name} {algo} out {placement}")

    def eager_registered(self, step, r, dtype, n=None):
        n = n or registered_sizes(dtype)[r.integers(3)]
        x = self.registered[(dtype, n)]
        in_place = bool(r.integers(2))
        algo = ("twoshot", "auto")[r.integers(2)] if in_place else ALGOS[r.integers(len(ALGOS))]
        data = RandomSum(dtype, n, self.sc.rank, self.sc.world, step)
        x.set(data.mine)
        self.delay(step)
        y = self.comm.allreduce(x, out=x if in_place else None, algo=algo, stream=self.stream)
        self.expect(y, data, f"step {step}: registered {n} x {dtype.name} {algo}"
                             f"{' in place' if in_place else ''}")

    def fused_call(self, step, dtype, x, shape, algo, kind, residual_in_place):
        tokens, hidden = shape
        s64, abs_sum, residual, weight, x_dev, w_dev = random_inputs(
            self.sc, dtype, tokens, hidden, (step,), self.stream)
        if x is not None:  # registered rows: refilled with this step's x
            _hip.memcpy_dtod(x.ptr, x_dev.ptr, x.nbytes, self.stream)
        res_dev = pyar.asarray(residual, stream=self.stream)
        out = pyar.empty((tokens, hidden), dtype, stream=self.stream)
        self.delay(step)
        got = self.comm.allreduce_rmsnorm(
            x_dev if x is None else x, res_dev, w_dev, EPS, out=out,
            residual_out=None if residual_in_place else pyar.empty_like(res_dev),
            stream=self.stream, quant=kind, algo=algo, group_size=group_size(hidden),
            fp8_dtype=None if kind is None or kind == "mxfp4" else FP8)
        self.comm.synchronize(self.stream)
        s = self.stream
        what = (f"step {step}: fused {tokens}x{hidden} {dtype.name} {algo} {kind} "
                f"{'staged' if x is None else 'registered'}")
        ok = self.fused.outputs(what, dtype, s64, abs_sum, residual, weight, host(got.out, s),
                                host(got.residual_out, s), kind, host(got.quantized, s),
                                host(got.scales, s),
                                group_size(hidden) if kind == "fp8_per_group" else None)
        self.wrong += not ok

    def fused_staged(self, step, r, dtype, shape=None, algo=None):
        shape = shape or (int(r.integers(1, 65)), HIDDEN[r.integers(len(HIDDEN))])
        algo = algo or FUSED_ALGOS[r.integers(len(FUSED_ALGOS))]
        self.fused_call(step, dtype, None, shape, algo, KINDS[r.integers(len(KINDS))],
                        bool(r.integers(2)))

    def fused_registered(self, step, r, dtype, shape=None):
        shape = shape or REGISTERED_ROWS[r.integers(len(REGISTERED_ROWS))]
        algo = FUSED_ALGOS[r.integers(len(FUSED_ALGOS))]
        self.fused_call(step, dtype, self.registered[(dtype, shape)], shape, algo,
                        KINDS[r.integers(len(KINDS))], bool(r.integers(2)))

    def register_cycle(self, step, r, dtype):
        n = int(r.integers(1, MAX_SIZE // dtype.itemsize))
        data = RandomSum(dtype, n, self.sc.rank, self.sc.world, step)
        x, _ = registrable(data.mine, self.stream)
        self.comm.register(x)
        self.delay(step)
        y = self.comm.allreduce(x, algo=ALGOS[r.integers(len(ALGOS))], stream=self.stream)
        self.expect(y, data, f"step {step}: registered for one call, {n} x {dtype.name}")
        self.comm.unregister(x)

    # --- graphs ---------------------------------------------------------------------

    def capture_graphs(self):
        s = self.stream
        for dtype in DTYPES:
            for algo in ("oneshot", "twoshot"):
                for registered in (False, True):
                    x = (self.registered[(dtype, GRAPH_N)] if registered
                         else pyar.empty((GRAPH_N,), dtype, stream=s))
                    out = pyar.empty((GRAPH_N,), dtype, stream=s)
                    with self.comm.capture(s) as graph:
                        self.comm.allreduce(x, out=out, algo=algo, stream=s)
                    self.graphs.append(("allreduce", dtype, algo, registered, graph, (x, out)))
            for algo in ("onestage", "twostage", "split"):
                arrays = [pyar.empty(GRAPH_ROWS, dtype, stream=s) for _ in range(4)]
                x, residual, out, residual_out = arrays
                weight = pyar.empty((GRAPH_ROWS[1],), dtype, stream=s)
                with self.comm.capture(s) as graph:
                    self.comm.allreduce_rmsnorm(x, residual, weight, EPS, out=out,
                                                residual_out=residual_out, stream=s, algo=algo)
                self.graphs.append(("fused", dtype, algo, False, graph, (*arrays, weight)))

    def replay(self, step, index):
        kind, dtype, algo, registered, graph, arrays = self.graphs[index]
        s = self.stream
        what = (f"step {step}: graph {kind} {dtype.name} {algo} "
                f"{'registered' if registered else 'staged'}")
        if kind == "allreduce":
            x, out = arrays
            data = RandomSum(dtype, GRAPH_N, self.sc.rank, self.sc.world, step)
            x.set(data.mine, stream=s)
            self.delay(step)
            graph.replay()
            self.expect(out, data, what)
            return
        x, residual, out, residual_out, weight = arrays
        s64, abs_sum, res_host, w_host, x_dev, _ = random_inputs(
            self.sc, dtype, *GRAPH_ROWS, (step,), s)
        _hip.memcpy_dtod(x.ptr, x_dev.ptr, x.nbytes, s)
        residual.set(res_host, stream=s)
        weight.set(w_host, stream=s)
        self.delay(step)
        graph.replay()
        self.comm.synchronize(s)
        self.wrong += not self.fused.outputs(what, dtype, s64, abs_sum, res_host, w_host,
                                             host(out, s), host(residual_out, s))

    # --- the run --------------------------------------------------------------------

    def step(self, step):
        r = rng(step, 1)  # the same draws on every rank
        kind = STEPS[r.choice(len(STEPS), p=WEIGHTS)]
        dtype = DTYPES[r.integers(len(DTYPES))]
        if kind == "graph":
            index = int(r.integers(len(self.graphs)))
            self.replay(step, index)
            kind = f"graph-{self.graphs[index][0]}"
        else:
            getattr(self, kind.replace("-", "_"))(step, r, dtype)
        self.calls[kind] += 1

    def warm_up(self):
        """Registers the buffers, captures the graphs, and makes every kind of
        call once at its largest size."""
        for dtype in DTYPES:
            for n in registered_sizes(dtype):
                x = pyar.empty((n,), dtype, stream=self.stream, ipc=True)
                self.comm.register(x)
                self.registered[(dtype, n)] = x
            for shape in REGISTERED_ROWS:
                x = pyar.empty(shape, dtype, stream=self.stream, ipc=True)
                self.comm.register(x)
                self.registered[(dtype, shape)] = x
        self.capture_graphs()
        step = WARM_UP_STEPS  # keys no step of the run draws
        for dtype in DTYPES:
            r = rng(step, 2)
            self.eager_staged(step, r, dtype, n=largest(dtype))
            self.eager_registered(step, r, dtype, n=largest(dtype))
            for algo in FUSED_ALGOS:
                self.fused_staged(step, r, dtype, shape=(64, max(HIDDEN)), algo=algo)
            self.fused_registered(step, r, dtype, shape=REGISTERED_ROWS[-1])
            self.register_cycle(step, r, dtype)
            step += 1
        for index in range(len(self.graphs)):
            self.replay(step, index)
            step += 1


def main(sc):
    seconds = float(os.environ.get("PYAR_SOAK_SECONDS", "20"))
    soak = Soak(sc)
    soak.warm_up()
    start = sample(sc)
    deadline = time.monotonic() + seconds
    began = time.monotonic()
    step = 0
    while sc.mpi.bcast(time.monotonic() < deadline if sc.rank == 0 else None, root=0):
        soak.step(step)
        step += 1
    elapsed = time.monotonic() - began
    end = sample(sc)
    device_mib = sc.max(start[0] - end[0]) / 2**20
    fds = sc.max(end[1] - start[1])
    rss_mib = sc.max(end[2] - start[2]) / 2**20
    sc.check(device_mib <= DEVICE_MIB, f"the GPU's free memory fell by {device_mib:.1f} MiB")
    sc.check(fds <= FDS, f"{fds} more open file descriptors")
    sc.check(rss_mib <= RSS_MIB, f"resident memory grew by {rss_mib:.1f} MiB")
    for _, _, _, _, graph, _ in soak.graphs:
        graph.close()
    soak.comm.close()
    sc.report(test="soak", seconds=round(elapsed, 1), calls=step, wrong=sc.sum(soak.wrong),
              by_kind=dict(sorted(soak.calls.items())), device_mib=round(device_mib, 2),
              fds=fds, rss_mib=round(rss_mib, 2),
              tolerance={"device_mib": DEVICE_MIB, "fds": FDS, "rss_mib": RSS_MIB},
              failed_checks=sc.sum(sc.failures))


if __name__ == "__main__":
    run("soak", main)
