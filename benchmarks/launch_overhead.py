#!/usr/bin/env python3
"""Host overhead of a kernel launch through pyar, against CuPy in the same run.

Measured, each as the median of several repeats:

- eager launches of an empty kernel: pyar ``Function.launch`` of
  ``pyar_test_empty`` and a CuPy ``RawKernel`` of ``extern "C" __global__ void
  empty() {}``, both on the same created (non-blocking) stream.  "host loop" is
  the wall time of the Python loop issuing the launches divided by their number;
  "incl. sync" adds the wait for the GPU to drain them (a throughput figure);
- eager launches of a kernel with 7 arguments (pointer, pointer, int32, int64,
  uint32, uint64, float32: pyar's ``pyar_test_store_args`` and the same kernel
  compiled by CuPy), to show the cost of packing arguments;
- graph replay: 100 empty launches captured into one graph, the graph
  replayed N times; per launch inside the graph: GPU time between two events,
  and host time per replay call.  CuPy's capture of the same, where it has it.

    python benchmarks/launch_overhead.py [--launches 10000] [--repeats 7] [--json out.json]

Without CuPy the pyar rows are printed and the baseline is reported missing.

``--collectives`` measures whole eager calls instead, under mpirun (1 to 8
ranks): ``comm.allreduce(x, out=y)`` staged and registered, with pyar and
CuPy arrays, the same call with plans disabled (every check on every call, as
before plans existed), ``allreduce_rmsnorm`` at one token, a bare
``Function.launch`` of the all-reduce kernel and of an empty kernel, a CuPy
RawKernel launch, CuPy's current-stream query alone (which a replay with
CuPy arrays makes once a call), the all-reduce replayed from a graph, and a loop of
``y = comm.allreduce(x)`` (new outputs) against the ``out=y`` loop, timed
as it is and again queued behind a kernel that keeps the stream busy for
BUSY_MS: a call that waited for the GPU (a synchronizing allocation or free)
would hold the host loop until that kernel ends:

    mpirun -n 8 --oversubscribe python benchmarks/launch_overhead.py --collectives
"""
import argparse
import contextlib
import itertools
import json
import os
import platform as host_platform
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import pyar._hip as hip  # noqa: E402
from pyar import _kernels  # noqa: E402
from pyar.bench import table  # noqa: E402

CUPY_EMPTY_SOURCE = 'extern "C" __global__ void empty() {}'
CUPY_STORE_ARGS_SOURCE = r'''
struct ArgRecord {
  unsigned long long pointer; long long i64; unsigned long long u64;
  int i32; unsigned int u32; float f32; unsigned int pad;
};
extern "C" __global__ void store_args(ArgRecord *out, const void *pointer, int i32,
                                      long long i64, unsigned int u32,
                                      unsigned long long u64, float f32) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    out->pointer = reinterpret_cast<unsigned long long>(pointer);
    out->i64 = i64; out->u64 = u64; out->i32 = i32; out->u32 = u32; out->f32 = f32;
    out->pad = 0xfeedbeefu;
  }
}
'''
STORE_ARGTYPES = ("ptr", "ptr", "int32", "int64", "uint32", "uint64", "float32")
RECORD_BYTES = 40


BUSY_MS = 200     # the kernel the busy-GPU loops queue behind
BUSY_CALLS = 200  # calls in those loops: few enough that the launch queue never fills

COLUMNS = ("case", "impl", "host_us", "host_min_us", "total_us", "gpu_us",
           "host_us_per_replay", "error")


def _no_op(*args):
    return None


def issue(n, function, args):
    """Call ``function(*args)`` n times: the loop every eager case shares."""
    for _ in itertools.repeat(None, n):
        function(*args)


def time_eager(function, args, synchronize, launches, repeats, warmup):
    """µs per launch over ``repeats`` loops of ``launches`` launches: the
    issuing loop alone (median, min), and up to the end of the GPU work."""
    issue(warmup, function, args)
    synchronize()
    host, total = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        issue(launches, function, args)
        issued = time.perf_counter()
        synchronize()
        done = time.perf_counter()
        host.append((issued - start) / launches * 1e6)
        total.append((done - start) / launches * 1e6)
    return {"host_us": statistics.median(host), "host_min_us": min(host),
            "total_us": statistics.median(total)}, host


def time_graph(replay, events, elapsed_ms, graph_size, replays, repeats):
    """Per launch inside the graph: GPU µs between two events around
    ``replays`` replays, and host µs per replay call.  ``events()`` gives a
    fresh (start, end) pair of _Recorders bound to the replay stream."""
    for _ in range(10):
        replay()
    _, warm = events()
    warm()
    warm.synchronize()
    gpu, host, total = [], [], []
    for _ in range(repeats):
        start_event, end_event = events()
        start = time.perf_counter()
        start_event()
        issue(replays, replay, ())
        end_event()
        issued = time.perf_counter()
        end_event.synchronize()
        done = time.perf_counter()
        gpu.append(elapsed_ms(start_event, end_event) * 1e3 / (replays * graph_size))
        host.append((issued - start) / replays * 1e6)
        total.append((done - start) / (replays * graph_size) * 1e6)
    return {"gpu_us": statistics.median(gpu), "host_us_per_replay": statistics.median(host),
            "total_us": statistics.median(total)}, gpu


class _Recorder:
    """An event bound to a stream: calling it records; synchronize() waits."""

    def __init__(self, event, record):
        self.event = event
        self._record = record

    def __call__(self):
        self._record(self.event)

    def synchronize(self):
        self.event.synchronize()


def make_row(case, impl, library, result=None, error=None):
    row = {column: None for column in COLUMNS}
    row.update(case=case, impl=impl, error=error)
    for key, value in (result or {}).items():
        row[key] = round(value, 4)
    row["library"] = library
    return row


def measure_pyar(options, stream, rows, samples):
    module = _kernels.load("test_kernels")
    empty = module.get_function("pyar_test_empty")
    store_args = module.get_function("pyar_test_store_args", STORE_ARGTYPES)
    record = hip.DeviceMemory(RECORD_BYTES)
    common = dict(synchronize=stream.synchronize, launches=options.launches,
                  repeats=options.repeats, warmup=options.warmup)

    def eager(case, impl, library, function, args):
        result, raw = time_eager(function, args, **common)
        rows.append(make_row(case, impl, library, result))
        samples[f"{case} / {impl}"] = raw

    eager("no launch: the loop and a Python call", "Python", "python", _no_op,
          (1, 1, (), 0, stream))
    eager("empty kernel, eager", "pyar Function.launch", "pyar", empty.launch,
          (1, 1, (), 0, stream))
    args = (record.ptr, record.ptr, -7, -(2**40), 2**31 + 5, 2**63 + 9, 1.25)
    eager("7 arguments, eager", "pyar Function.launch", "pyar", store_args.launch,
          (1, 1, args, 0, stream))

    stream.begin_capture()
    for _ in range(options.graph_size):
        empty.launch(1, 1, (), 0, stream)
    graph = stream.end_capture()
    executable = graph.instantiate()
    case = f"graph replay ({options.graph_size} empty launches)"
    result, raw = time_graph(
        lambda: executable.launch(stream),
        lambda: (_Recorder(hip.Event(), lambda e: e.record(stream)),
                 _Recorder(hip.Event(), lambda e: e.record(stream))),
        lambda a, b: a.event.elapsed_time(b.event),
        options.graph_size, options.graph_replays, options.repeats)
    rows.append(make_row(case, "pyar GraphExec.launch", "pyar", result))
    samples[f"{case} / pyar"] = raw
    stream.synchronize()
    executable.close()
    graph.close()
    record.free()


def cupy_stream(cupy, stream):
    """pyar's stream as a CuPy stream (entered with ``with``, CuPy launches on it)."""
    from_external = getattr(cupy.cuda.Stream, "from_external", None)  # CuPy >= 14
    return (from_external(stream) if from_external is not None
            else cupy.cuda.ExternalStream(stream.handle))


def measure_cupy(cupy, options, stream, rows, samples):
    empty = cupy.RawKernel(CUPY_EMPTY_SOURCE, "empty")
    store_args = cupy.RawModule(code=CUPY_STORE_ARGS_SOURCE).get_function("store_args")
    record = cupy.zeros(RECORD_BYTES, cupy.uint8)
    external = cupy_stream(cupy, stream)
    common = dict(synchronize=stream.synchronize, launches=options.launches,
                  repeats=options.repeats, warmup=options.warmup)

    def eager(case, impl, function, args):
        result, raw = time_eager(function, args, **common)
        rows.append(make_row(case, impl, "cupy", result))
        samples[f"{case} / {impl}"] = raw

    with external:  # CuPy launches on its current stream: pyar's stream
        eager("empty kernel, eager", "CuPy RawKernel", empty, ((1,), (1,), ()))
        args = (record, np.uint64(record.data.ptr), np.int32(-7), np.int64(-(2**40)),
                np.uint32(2**31 + 5), np.uint64(2**63 + 9), np.float32(1.25))
        eager("7 arguments, eager", "CuPy RawModule function", store_args,
              ((1,), (1,), args))
    case = f"graph replay ({options.graph_size} empty launches)"
    capture_stream = cupy.cuda.Stream(non_blocking=True)
    try:
        with capture_stream:
            capture_stream.begin_capture()
            for _ in range(options.graph_size):
                empty((1,), (1,), ())
            graph = capture_stream.end_capture()
    except Exception as error:  # a CuPy without graph capture: say so, keep the rest
        rows.append(make_row(case, "CuPy Graph.launch", "cupy",
                             error=f"{type(error).__name__}: {error}"))
        return
    result, raw = time_graph(
        lambda: graph.launch(capture_stream),
        lambda: (_Recorder(cupy.cuda.Event(), lambda e: e.record(capture_stream)),
                 _Recorder(cupy.cuda.Event(), lambda e: e.record(capture_stream))),
        lambda a, b: cupy.cuda.get_elapsed_time(a.event, b.event),
        options.graph_size, options.graph_replays, options.repeats)
    rows.append(make_row(case, "CuPy Graph.launch", "cupy", result))
    samples[f"{case} / cupy"] = raw


def load_cupy():
    """(cupy, None) or (None, why the baseline is missing)."""
    try:
        import cupy
    except ImportError as error:
        return None, f"CuPy is not installed ({error})"
    try:
        cupy.RawKernel(CUPY_EMPTY_SOURCE, "empty").compile()
    except Exception as error:
        return None, f"CuPy cannot compile kernels here ({type(error).__name__}: {error})"
    return cupy, None


def fmt(value):
    return "-" if value is None else f"{value:.3f}"


def ratios(rows):
    """pyar / CuPy for each case both measured: host-loop µs per launch for
    eager launches, GPU µs per launch for graph replay."""
    by_case = {}
    for row in rows:
        if row["error"] is not None:
            continue
        value = row["host_us"] if row["host_us"] is not None else row["gpu_us"]
        by_case.setdefault(row["case"], {})[row["library"]] = value
    return {case: round(values["pyar"] / values["cupy"], 4) for case, values in by_case.items()
            if "pyar" in values and "cupy" in values and values["cupy"]}


def markdown(rows, ratio, missing, header):
    head = ["case", "implementation", "µs/launch, host loop (median)", "min",
            "µs/launch incl. sync", "graph: GPU µs/launch", "graph: host µs/replay"]
    cells = []
    for row in rows:
        if row["error"] is not None:
            cells.append([row["case"], row["impl"], f"unavailable: {row['error']}", "", "", "",
                          ""])
            continue
        cells.append([row["case"], row["impl"], fmt(row["host_us"]), fmt(row["host_min_us"]),
                      fmt(row["total_us"]), fmt(row["gpu_us"]), fmt(row["host_us_per_replay"])])
    lines = [header, "", table.markdown(head, cells), ""]
    if missing:
        lines.append(f"CuPy baseline missing: {missing}")
    else:
        lines.append(table.markdown(["ratio pyar / CuPy (eager: host loop; graph: GPU time)",
                                     "value"],
                                    [[case, f"{value:.2f}"] for case, value in ratio.items()]))
    return "\n".join(lines)


# --- whole eager collective calls (--collectives, under mpirun) ---------------------

COLLECTIVE_COLUMNS = ("case", "impl", "bytes", "host_us", "host_min_us", "total_us")
GRAPH_CALLS = 20  # collectives captured into one graph


def _barrier_timed(comm, mpi, stream, function, args, calls, repeats, queued_first=None):
    """µs per call: host loop (median, min) and up to the end of the GPU work
    (median), every rank starting each repeat together, each repeat's calls
    queued behind what ``queued_first()`` queues on the stream."""
    host, total = [], []
    issue(min(calls, 50), function, args)
    comm.synchronize(stream)
    for _ in range(repeats):
        mpi.Barrier()
        if queued_first is not None:
            queued_first()
        start = time.perf_counter()
        issue(calls, function, args)
        issued = time.perf_counter()
        comm.synchronize(stream)
        done = time.perf_counter()
        host.append((issued - start) / calls * 1e6)
        total.append((done - start) / calls * 1e6)
    return {"host_us": statistics.median(host), "host_min_us": min(host),
            "total_us": statistics.median(total)}


def _collective_row(case, impl, nbytes, result):
    row = {column: None for column in COLLECTIVE_COLUMNS}
    row.update(case=case, impl=impl, bytes=nbytes)
    row.update({k: round(v, 4) for k, v in result.items()})
    return row


@contextlib.contextmanager
def _checked_every_call():
    """Plans disabled inside the block: every call checks and plans.  The
    per-call path neither replays nor remembers a call on a capturing stream,
    so it is told that every stream captures; the checks ask the stream itself."""
    from pyar.comm import _eager
    asks = _eager.stream_is_capturing
    _eager.stream_is_capturing = lambda handle: True
    try:
        yield
    finally:
        _eager.stream_is_capturing = asks


def _planned_launch(comm, x, out, stream):
    """The one launch pyar.comm.plan.allreduce gives ``comm.allreduce(x, out=out)``,
    recorded from a checked call (only its checks look up a registered input's table)."""
    from pyar.comm import plan
    planned = []
    planner = plan.allreduce

    def recorded(*args):
        planned.append(planner(*args))
        return planned[-1]

    plan.allreduce = recorded
    try:
        with _checked_every_call():
            comm.allreduce(x, out=out, stream=stream)
    finally:
        plan.allreduce = planner
    (launch,), = planned
    return launch


def measure_collectives(options, mpi, comm, stream):
    """Rows for whole eager calls at ``options.collective_bytes`` on this world."""
    import pyar
    rows = []
    world = comm.world
    nbytes = options.collective_bytes
    count = nbytes // 4
    calls, repeats = options.collective_calls, options.repeats
    timed = lambda function, args, n=calls: _barrier_timed(comm, mpi, stream, function, args,
                                                           n, repeats)
    host = np.ones(count, np.float32)
    registered = pyar.asarray(host, stream=stream, ipc=True)
    comm.register(registered)
    staged = pyar.asarray(host, stream=stream)
    y = pyar.empty_like(staged)
    algo = "auto"

    module = _kernels.load("test_kernels")
    empty = module.get_function("pyar_test_empty")
    rows.append(_collective_row("empty kernel", "pyar Function.launch", 0,
                                timed(empty.launch, (1, 1, (), 0, stream))))
    if world > 1:
        launch = _planned_launch(comm, registered, y, stream)
        rows.append(_collective_row("all-reduce kernel alone (registered input)",
                                    "pyar Function.launch", nbytes,
                                    timed(launch.function.launch,
                                          (launch.grid, launch.block, (*launch.args, 0), 0,
                                           stream))))
    for name, x in (("registered", registered), ("staged", staged)):
        call = lambda x=x: comm.allreduce(x, out=y, algo=algo, stream=stream)
        rows.append(_collective_row(f"comm.allreduce(x, out=y), {name}, pyar arrays",
                                    "pyar, plan replayed", nbytes, timed(call, ())))
        with _checked_every_call():
            rows.append(_collective_row(f"comm.allreduce(x, out=y), {name}, pyar arrays",
                                        "pyar, checked every call (before)", nbytes,
                                        timed(call, ())))
    rows += _cupy_collective_rows(options, comm, stream, timed, host, nbytes)
    if world > 1:
        rows += _fused_rows(comm, stream, timed)
    rows.append(_graph_row(comm, mpi, stream, registered, y, nbytes, repeats))
    new_outputs = lambda: comm.allreduce(registered, algo=algo, stream=stream)
    rows.append(_collective_row("y = comm.allreduce(x), registered (new outputs)",
                                "pyar, plan replayed", nbytes,
                                timed(new_outputs, (), options.alloc_calls)))
    given = lambda: comm.allreduce(registered, out=y, algo=algo, stream=stream)
    rows.append(_collective_row("comm.allreduce(x, out=y), registered, same loop length",
                                "pyar, plan replayed", nbytes,
                                timed(given, (), options.alloc_calls)))
    # Behind a busy stream: a host loop far shorter than BUSY_MS shows that no
    # call waited for the GPU.
    spin = module.get_function("pyar_test_spin", ("uint64",))
    busy = lambda: spin.launch(1, 32, (BUSY_MS * 1_000_000,), stream=stream)
    for case, function in (("y = comm.allreduce(x)", new_outputs),
                           ("comm.allreduce(x, out=y)", given)):
        rows.append(_collective_row(
            f"{case}, registered, {BUSY_CALLS} calls behind a {BUSY_MS} ms kernel",
            "pyar, plan replayed", nbytes,
            _barrier_timed(comm, mpi, stream, function, (), BUSY_CALLS, 3, queued_first=busy)))
    return rows


def _cupy_collective_rows(options, comm, stream, timed, host, nbytes):
    cupy, missing = load_cupy()
    if cupy is None:
        return [_collective_row(f"CuPy rows unavailable: {missing}", "-", nbytes, {})]
    cupy.cuda.Device(comm.device).use()
    external = cupy_stream(cupy, stream)
    rows = []
    with external:  # CuPy's current stream is the call's: the replay needs no ordering
        registered = cupy.asarray(host)
        comm.register(registered)
        staged = cupy.asarray(host)
        y = cupy.empty_like(staged)
        raw = cupy.RawKernel(CUPY_EMPTY_SOURCE, "empty")
        rows.append(_collective_row("empty kernel", "CuPy RawKernel", 0,
                                    timed(raw, ((1,), (1,), ()))))
        for name, x in (("registered", registered), ("staged", staged)):
            call = lambda x=x: comm.allreduce(x, out=y, stream=stream)
            rows.append(_collective_row(f"comm.allreduce(x, out=y), {name}, CuPy arrays",
                                        "pyar, plan replayed", nbytes, timed(call, ())))
        # What a replay asks CuPy once a call, alone: its share of the CuPy rows.
        current = cupy.cuda.get_current_stream
        rows.append(_collective_row("CuPy's current stream, get_current_stream().ptr",
                                    "CuPy, host only", 0, timed(lambda: current().ptr, ())))
        external.synchronize()
    return rows


def _fused_rows(comm, stream, timed):
    import ml_dtypes
    import pyar
    hidden = 4096
    bf16 = np.dtype(ml_dtypes.bfloat16)
    x, residual, out = (pyar.zeros((1, hidden), bf16, stream=stream) for _ in range(3))
    weight = pyar.asarray(np.ones(hidden, bf16), stream=stream)
    call = lambda: comm.allreduce_rmsnorm(x, residual, weight, out=out, stream=stream)
    rows = [_collective_row("comm.allreduce_rmsnorm, 1 token x 4096 bf16, staged",
                            "pyar, plan replayed", x.nbytes, timed(call, ()))]
    with _checked_every_call():
        rows.append(_collective_row("comm.allreduce_rmsnorm, 1 token x 4096 bf16, staged",
                                    "pyar, checked every call (before)", x.nbytes,
                                    timed(call, ())))
    return rows


def _graph_row(comm, mpi, stream, x, y, nbytes, repeats):
    """The registered all-reduce replayed from a graph of GRAPH_CALLS calls:
    µs per collective, host (per replay / GRAPH_CALLS) and incl. sync."""
    with comm.capture(stream) as graph:
        for _ in range(GRAPH_CALLS):
            comm.allreduce(x, out=y, stream=stream)
    replays = 100
    result = _barrier_timed(comm, mpi, stream, graph.replay, (), replays, repeats)
    graph.close()
    return _collective_row(f"comm.allreduce(x, out=y), registered, graph of {GRAPH_CALLS}",
                           "pyar GraphExec.launch", nbytes,
                           {k: v / GRAPH_CALLS for k, v in result.items()})


def collectives_markdown(rows, header):
    """One table; host µs against a bare Function.launch of the all-reduce
    kernel (or of the empty kernel at one rank) and incl.-sync µs against
    the graph replay of the same call."""
    bare = next((r["host_us"] for r in rows if r["case"].startswith("all-reduce kernel")),
                next(r["host_us"] for r in rows if r["impl"] == "pyar Function.launch"))
    graph = next(r["total_us"] for r in rows if r["impl"] == "pyar GraphExec.launch")
    lines = [header, "",
             "| case | implementation | bytes | host µs/call (median) | min | "
             "µs/call incl. sync | host / bare launch | host − bare launch µs | "
             "incl. sync − graph µs |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        if row["host_us"] is None:
            lines.append(f"| {row['case']} | {row['impl']} | | | | | | | |")
            continue
        lines.append(f"| {row['case']} | {row['impl']} | {row['bytes']} | {fmt(row['host_us'])} "
                     f"| {fmt(row['host_min_us'])} | {fmt(row['total_us'])} | "
                     f"{row['host_us'] / bare:.2f} | {fmt(row['host_us'] - bare)} | "
                     f"{fmt(row['total_us'] - graph)} |")
    return "\n".join(lines)


def collectives_main(options):
    from mpi4py import MPI
    import pyar
    mpi = MPI.COMM_WORLD
    comm = pyar.Communicator(mpi)
    stream = hip.Stream()
    device = hip.Device(comm.device)
    rows = measure_collectives(options, mpi, comm, stream)
    if mpi.Get_rank() == 0:
        header = (f"## Whole eager calls: {comm.world} rank(s) on {device.name} ({device.arch}), "
                  f"{options.collective_calls} calls x {options.repeats} repeats "
                  f"({options.alloc_calls} for the new-output loop)")
        print(collectives_markdown(rows, header), flush=True)
        if options.json:
            with open(options.json, "w") as f:
                json.dump({"benchmark": "launch_overhead_collectives", "world": comm.world,
                           "device": device.name, "rows": rows}, f, indent=2)
            print(f"\nwrote {options.json}")
    comm.synchronize(stream)
    comm.close()
    stream.close()
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--launches", type=int, default=10_000,
                        help="eager launches per timed loop (default 10000)")
    parser.add_argument("--repeats", type=int, default=7, help="timed loops per case")
    parser.add_argument("--warmup", type=int, default=1000, help="untimed launches first")
    parser.add_argument("--graph-size", type=int, default=100,
                        help="launches captured into the graph")
    parser.add_argument("--graph-replays", type=int, default=1000,
                        help="graph replays per timed loop")
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--collectives", action="store_true",
                        help="measure whole eager collective calls (run under mpirun)")
    parser.add_argument("--collective-bytes", type=int, default=1024,
                        help="message size of the collective rows (default 1 KiB)")
    parser.add_argument("--collective-calls", type=int, default=500,
                        help="calls per timed loop, few enough that the GPU queue never fills")
    parser.add_argument("--alloc-calls", type=int, default=10_000,
                        help="calls of the new-output loop and its out= baseline")
    options = parser.parse_args(argv)
    if options.collectives:
        return collectives_main(options)
    for name in ("launches", "repeats", "graph_size", "graph_replays"):
        if getattr(options, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")

    hip.set_device(options.device)
    device = hip.Device(options.device)
    stream = hip.Stream()
    rows, samples = [], {}
    measure_pyar(options, stream, rows, samples)
    cupy, missing = load_cupy()
    if cupy is not None:
        cupy.cuda.Device(options.device).use()
        measure_cupy(cupy, options, stream, rows, samples)
    ratio = ratios(rows)
    header = (f"## Kernel launch overhead: {device.name} ({device.arch}), pyar on "
              f"{hip.platform()}, {options.launches} launches x {options.repeats} repeats, "
              f"graph of {options.graph_size} launches x {options.graph_replays} replays")
    print(markdown(rows, ratio, missing, header), flush=True)
    if options.json:
        result = {
            "benchmark": "launch_overhead",
            "device": {"ordinal": options.device, "name": device.name, "arch": device.arch,
                       "platform": hip.platform(), "driver_version": hip.driver_version()},
            "host": {"python": sys.version.split()[0], "machine": host_platform.machine()},
            "config": {k: getattr(options, k) for k in
                       ("launches", "repeats", "warmup", "graph_size", "graph_replays")},
            "cupy_version": None if cupy is None else cupy.__version__,
            "baseline_missing": missing,
            "rows": rows,
            "ratio_pyar_over_cupy": ratio,
            "samples_us": samples,
        }
        with open(options.json, "w") as f:
            json.dump(result, f, indent=2)
        print(f"\nwrote {options.json}")
    stream.synchronize()
    stream.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
