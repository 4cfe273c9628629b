"""``--latency``: the forced algorithms side by side per size, against the
floor of an empty kernel (the LL latency target).

Per size and mode (eager, graph) one row: one-shot, two-shot, LL
(``algo="ll"``) and the LL two-shot (``algo="ll_twoshot"``, column
``ll2_us``) forced through the planner, each LL blank above the largest
input it takes on the communicator's world (plan.ll_largest), and
``floor_us``, an empty kernel (``pyar_test_empty``) launched on the same
stream: a plain launch in eager rows, replayed from a graph of as many
launches as the all-reduce graphs hold in graph rows.  The target: LL within
0.6x the barrier one-shot, or within 1.2x the floor, whichever is larger.
``best_vs_oneshot``: the faster LL (one-shot or two-shot) over the barrier
one-shot.  With ``--signal-floor``, ``signal_us`` times one exchange of
flags among the ranks (``pyar_test_flag_exchange``: each rank stores a flag
at every peer and waits for every peer's), the least that any collective
which waits for its peers pays, launched as the empty kernel is;
``ll_vs_signal`` is LL over it."""
import numpy as np

import pyar
from pyar import _hip, _kernels
from pyar.bench import exact, measure
from pyar.bench.points import points
from pyar.bench.sizes import human_bytes
from pyar.bench.table import Table
from pyar.comm import algorithms, exchange, plan

ALGOS = ("oneshot", "twoshot", "ll", "ll_twoshot")
# The row field (and column) of each algorithm's microseconds.
FIELDS = {"oneshot": "oneshot_us", "twoshot": "twoshot_us", "ll": "ll_us",
          "ll_twoshot": "ll2_us"}
MODES = ("eager", "graph")
ONESHOT_FACTOR = 0.6  # LL at most this times the barrier one-shot ...
FLOOR_FACTOR = 1.2    # ... or this times the empty kernel, whichever is larger
COLUMNS = [("size", 10), ("count", 11), ("type", 9), ("mode", 6), ("oneshot_us", 10),
           ("twoshot_us", 10), ("ll_us", 8), ("ll2_us", 8), ("floor_us", 8), ("signal_us", 9),
           ("ll_vs_oneshot", 13), ("ll_vs_floor", 11), ("ll_vs_signal", 12), ("target", 6),
           ("best_vs_oneshot", 15), ("wrong", 5)]
LEGEND = ("oneshot/twoshot/ll/ll2: forced algorithms, ll2 the LL two-shot (ll and ll2 blank "
          "above their limits); floor_us: an empty kernel on the same stream (graph rows: "
          f"replayed from a graph); target: ll_us <= max({ONESHOT_FACTOR} x oneshot_us, "
          f"{FLOOR_FACTOR} x floor_us); signal_us (--signal-floor): one flag exchange among "
          "the ranks, launched as the empty kernel is; best_vs_oneshot: min(ll_us, ll2_us) / "
          "oneshot_us; "
          "wrong: elements that differ from the exact sum, all ranks and algorithms "
          "(- unchecked)")


def _ratio(top, bottom):
    return None if top is None or not bottom else top / bottom


def row(nbytes, count, dtype, mode, times_us, floor_us, wrong=None, signal_us=None):
    """A row from the forced algorithms' microseconds (``times_us``: {algo:
    us, None where the algorithm does not take the size}), the floor's and
    the flag exchange's (None: not measured)."""
    times = {algo: times_us.get(algo) for algo in ALGOS}
    ll, oneshot = times["ll"], times["oneshot"]
    target = None
    if ll is not None and oneshot is not None and floor_us is not None:
        target = ll <= max(ONESHOT_FACTOR * oneshot, FLOOR_FACTOR * floor_us)
    lls = [us for algo, us in times.items()
           if algo in algorithms.LL_ALGORITHMS and us is not None]
    return {"bytes": nbytes, "count": count, "dtype": dtype, "mode": mode,
            **{FIELDS[algo]: us for algo, us in times.items()}, "floor_us": floor_us,
            "signal_us": signal_us, "ll_vs_oneshot": _ratio(ll, oneshot),
            "ll_vs_floor": _ratio(ll, floor_us), "ll_vs_signal": _ratio(ll, signal_us),
            "target": target, "best_vs_oneshot": _ratio(min(lls, default=None), oneshot),
            "wrong": wrong}


def table():
    return Table([name for name, _ in COLUMNS], [width for _, width in COLUMNS])


def _us(value):
    return None if value is None else f"{value:.2f}"


def _times(value):
    return None if value is None else f"{value:.2f}x"


def cells(row):
    target = None if row["target"] is None else ("yes" if row["target"] else "no")
    return [human_bytes(row["bytes"]), row["count"], row["dtype"], row["mode"],
            *(_us(row[FIELDS[algo]]) for algo in ALGOS), _us(row["floor_us"]),
            _us(row.get("signal_us")), _times(row["ll_vs_oneshot"]),
            _times(row["ll_vs_floor"]), _times(row.get("ll_vs_signal")), target,
            _times(row["best_vs_oneshot"]), row.get("wrong")]


def takes(algo, nbytes, max_size, world):
    """Whether forced ``algo`` takes an input of ``nbytes`` on ``world`` ranks
    of a communicator made with ``max_size``."""
    if algo not in algorithms.LL_ALGORITHMS:
        return True
    return nbytes <= plan.ll_largest(algo, plan.ll_segment(max_size), world)


def point_count(sizes):
    return len(MODES) * sizes


class Floor:
    """The empty kernel's time per launch on ``stream``, eager or replayed
    from a graph of ``graph_calls`` launches (slowest rank)."""

    def __init__(self, mpi, stream, graph_calls):
        self.mpi, self.stream, self.graph_calls = mpi, stream, graph_calls
        self.empty = _kernels.load("test_kernels").get_function("pyar_test_empty")

    def launch(self):
        """Queues one launch on the stream."""
        self.empty.launch(1, 1, (), 0, self.stream)

    def seconds(self, mode, iterations, warmup):
        if mode == "eager":
            return measure.time_per_call(self.mpi, self.launch, iterations, warmup,
                                         self.stream)
        self.stream.begin_capture()
        for _ in range(self.graph_calls):
            self.launch()
        graph = self.stream.end_capture()
        executable = graph.instantiate()
        try:
            return measure.time_per_call(
                self.mpi, lambda: executable.launch(self.stream),
                max(1, iterations // self.graph_calls), 1, self.stream) / self.graph_calls
        finally:
            self.stream.synchronize()
            executable.close()
            graph.close()


class SignalFloor(Floor):
    """One flag exchange among the ranks of ``mpi`` (pyar_test_flag_exchange),
    timed as Floor times the empty kernel.  Each rank's device memory holds a
    flag slot per rank, the count of its exchanges and the count of waits
    that gave up; peers map it through IPC.  ``close`` raises if a wait gave
    up: a floor measured over timeouts would mean nothing."""

    def __init__(self, mpi, stream, graph_calls, timeout_ns):
        super().__init__(mpi, stream, graph_calls)
        rank, world = mpi.Get_rank(), mpi.Get_size()
        if world > 32:
            raise ValueError(f"the flag exchange runs a thread a rank in one warp: at most "
                             f"32 ranks, not {world}")
        self.world, self.timeout_ns = world, timeout_ns
        # uint64 slots, one a rank; then the uint64 count; then the uint32 give-ups
        self.count, self.gave_up = 8 * world, 8 * world + 8
        size = self.gave_up + 8
        self.exchange = _kernels.load("test_kernels").get_function(
            "pyar_test_flag_exchange", ("ptr", "ptr", "ptr", "uint32", "uint64", "ptr"))
        self.memory = _hip.DeviceMemory(size, uncached=True)
        _hip.memset(self.memory.ptr, 0, size)
        # run_everywhere: a handle that fails on one rank raises on all, not a hang
        handles = mpi.allgather(exchange.run_everywhere(mpi, _hip.ipc_get_handle,
                                                        self.memory.ptr))
        self.mappings = exchange.run_everywhere(
            mpi, lambda: [_hip.ipc_open(h) for r, h in enumerate(handles) if r != rank])
        bases = [m.ptr for m in self.mappings]
        bases.insert(rank, self.memory.ptr)
        self.peers = _hip.DeviceMemory(8 * world)
        _hip.memcpy_htod(self.peers.ptr, np.array([b + 8 * rank for b in bases], np.uint64))
        _hip.device_synchronize()
        mpi.Barrier()   # every rank's slots are zero before any rank's first exchange

    def launch(self):
        """Queues one exchange on the stream (a warp: one thread a rank)."""
        m = self.memory.ptr
        self.exchange.launch(1, 32, (self.peers.ptr, m, m + self.count, self.world,
                                     self.timeout_ns, m + self.gave_up), 0, self.stream)

    def close(self):
        self.stream.synchronize()
        gave_up = np.zeros(1, np.uint32)
        _hip.memcpy_dtoh(gave_up, self.memory.ptr + self.gave_up)
        self.mpi.Barrier()   # no peer still waits on this rank's slots
        for mapping in self.mappings:
            mapping.close()
        self.mpi.Barrier()   # every peer's mapping is closed before the memory goes
        self.peers.free()
        self.memory.free()
        gave_up = self.mpi.allreduce(int(gave_up[0]))
        if gave_up:
            raise RuntimeError(f"the signal floor's flag exchange gave up {gave_up} waits "
                               f"(timeout {self.timeout_ns} ns): no floor measured")


def sweep(args, comm, mpi, largest, show, graph_calls, time_point):
    """Every size's eager and graph rows; ``time_point(src, dst, algo, mode,
    iterations, stream)`` times one forced all-reduce as the main sweep does."""
    dtype = np.dtype(args.dtype_value)
    world = comm.world
    stream = _hip.Stream()
    x = pyar.empty((largest // dtype.itemsize,), dtype, stream=stream, ipc=True)
    y = pyar.empty_like(x)
    x.set(exact.exact_inputs(x.size, mpi.Get_rank()).astype(dtype), stream=stream)
    comm.register(x)
    floor = Floor(mpi, stream, graph_calls)
    signal = (SignalFloor(mpi, stream, graph_calls, comm.geometry.timeout_ns)
              if args.signal_floor and world > 1 else None)
    rows = []
    for count, moved, iterations, src, dst, expected in points(args, x, y, largest, world):
        if count != x.size:
            comm.register(src)
        for mode in MODES:
            times, wrong = {}, 0 if args.check else None
            for algo in ALGOS:
                if not takes(algo, moved, comm.max_size, world):
                    continue
                _hip.memset(dst.ptr, 0, dst.nbytes, stream)  # a stale right answer cannot pass
                times[algo] = time_point(src, dst, algo, mode, iterations, stream) * 1e6
                if args.check:
                    wrong += exact.wrong_on_all_ranks(mpi, dst, expected, stream)
            floor_us = floor.seconds(mode, iterations, args.warmup) * 1e6
            signal_us = (None if signal is None
                         else signal.seconds(mode, iterations, args.warmup) * 1e6)
            rows.append(row(moved, count, args.dtype, mode, times, floor_us, wrong, signal_us))
            show(rows[-1])
    try:
        if signal is not None:
            signal.close()  # raises where a wait gave up: no floor is reported then
    finally:
        stream.close()
    return rows
