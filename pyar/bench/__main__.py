"""python -m pyar.bench: sweep message sizes and algorithms, print tables.

Run under mpirun: ``mpirun -n 4 python -m pyar.bench -b 1K -e 256M``.  Every
size is also timed through the host (device-to-host copy, mpi4py Allreduce,
copy back: what a program does without pyar), and each pyar row gives its
time over that one.  With ``--node-size K``, the all-reduce across IPC
domains of K ranks (simulated nodes on one machine) instead
(pyar/bench/nodes.py).  With ``--fused``, the fused all-reduce + RMSNorm against
the unfused steps per token count instead (``--hidden``, ``--tokens``,
``--quant``).  With ``--latency``, per size the forced one-shot, two-shot
and LL beside an empty kernel's time, eager and from a graph, instead
(pyar/bench/latency.py).  Rows are printed as they are measured.
"""
import argparse
import socket
import sys

import ml_dtypes
import numpy as np
from mpi4py import MPI

import pyar
from pyar import _hip, diagnostics
from pyar.bench import exact, fused, latency, measure, nodes, report, traffic
from pyar.bench.host_mpi import HostRoundTrip
from pyar.bench.progress import Progress
from pyar.bench.sizes import doubling, parse_size
from pyar.comm import algorithms
from pyar.comm.hierarchical import HierarchicalCommunicator

DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
GRAPH_CALLS = 20  # all-reduces per captured graph in --graph rows


class RankZeroParser(argparse.ArgumentParser):
    """Usage errors printed once, by rank 0; every rank exits with status 2."""

    def error(self, message):
        if MPI.COMM_WORLD.Get_rank() == 0:
            self.print_usage(sys.stderr)
            print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _size(text):
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_args(argv):
    parser = RankZeroParser(prog="python -m pyar.bench", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-b", "--min", type=_size, default=parse_size("1K"),
                        help="smallest message (bytes, or 64K, 16M, 1GiB)")
    parser.add_argument("-e", "--max", type=_size, default=parse_size("256M"),
                        help="largest message")
    parser.add_argument("-f", "--factor", type=int, default=2,
                        help="multiply the size by this from one row to the next")
    parser.add_argument("-d", "--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--algos", default="auto,oneshot,twoshot",
                        help="comma-separated: auto, oneshot, twoshot")
    parser.add_argument("--staged", action="store_true",
                        help="also time auto with staged (copied) input")
    parser.add_argument("--graph", action="store_true",
                        help=f"also time auto replayed from a graph of {GRAPH_CALLS} calls")
    parser.add_argument("--max-size", type=_size, default=parse_size("64M"),
                        help="communicator scratch size")
    parser.add_argument("-w", "--warmup", type=int, default=5, help="untimed calls per point")
    parser.add_argument("-n", "--iters", type=int, default=0,
                        help="timed calls per point (0: by size)")
    parser.add_argument("-c", "--check", type=int, choices=(0, 1), default=1,
                        help="1: check every measured size against the exact sum (the "
                             "'wrong' column counts elements that differ); 0: skip")
    parser.add_argument("--json", help="write results here")
    parser.add_argument("--plot", help="write a PNG plot here (needs matplotlib: "
                                       "pip install 'pyar[plot]')")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar (it is drawn only on a terminal anyway)")
    parser.add_argument("--node-size", type=int, default=None,
                        help="ranks per IPC domain: time the all-reduce across domains "
                             "(nodes) of this many ranks against the MPI host round trip")
    parser.add_argument("--fused", action="store_true",
                        help="time allreduce_rmsnorm against the unfused steps instead")
    parser.add_argument("--latency", action="store_true",
                        help="time the forced oneshot, twoshot and ll (where it takes the "
                             "size) beside an empty kernel, eager and from a graph, instead")
    parser.add_argument("--signal-floor", action="store_true",
                        help="--latency: also time one flag exchange among the ranks, the "
                             "least a collective that waits for its peers pays")
    parser.add_argument("--hidden", type=int, default=4096, help="--fused: hidden size")
    parser.add_argument("--tokens", type=fused.parse_tokens, default=fused.DEFAULT_TOKENS,
                        help="--fused: comma-separated token counts")
    parser.add_argument("--quant", default="none,fp8_per_token",
                        help=f"--fused: comma-separated, of {', '.join(fused.QUANT_CHOICES)}")
    args = parser.parse_args(argv)
    args.dtype_value = DTYPES[args.dtype]
    try:
        args.quants = fused.parse_quants(args.quant)
        args.algos = [algorithms.validate(a.strip()) for a in args.algos.split(",") if a.strip()]
    except ValueError as exc:
        parser.error(str(exc))
    if not args.tokens or min(args.tokens) < 1:
        parser.error("--tokens needs positive token counts")
    if args.min <= 0 or args.max < args.min:
        parser.error("need 0 < --min <= --max")
    if args.factor < 2:
        parser.error("--factor must be at least 2")
    if args.iters < 0 or args.warmup < 0:
        parser.error("--iters and --warmup must be >= 0")
    if args.node_size is not None:
        if args.node_size < 1:
            parser.error("--node-size must be a positive number of ranks")
        if args.fused or args.graph or args.staged:
            parser.error("--node-size times the all-reduce across domains alone: no --fused, "
                         "--graph (MPI calls cannot be captured) or --staged")
    if args.latency and (args.fused or args.node_size is not None or args.staged or args.graph
                         or args.plot):
        parser.error("--latency times its own eager and graph rows of the forced algorithms: "
                     "no --fused, --node-size, --staged, --graph or --plot")
    if args.signal_floor and not args.latency:
        parser.error("--signal-floor is a column of --latency")
    if args.plot:
        if args.fused:
            parser.error("--plot draws the all-reduce sweep; --fused has no plot")
        if not report.can_plot():
            parser.error("--plot needs matplotlib, which is not installed: "
                         "pip install 'pyar[plot]' (or matplotlib)")
    return args


def shared_gpu(world_comm, device):
    """True when every rank runs on the same physical GPU (the one-GPU tier)."""
    bus_ids = world_comm.allgather(_hip.Device(device).pci_bus_id)
    return len(set(bus_ids)) == 1 and len(bus_ids) > 1


def _environment(comm, mpi):
    """Whether the ranks share one GPU, and then its copy bandwidth."""
    one_gpu = shared_gpu(mpi, comm.device)
    copy_bw = measure.copy_bandwidth() if one_gpu and mpi.Get_rank() == 0 else None
    copy_bw = mpi.bcast(copy_bw)
    return {"copy_bandwidth_GBps": copy_bw / 1e9 if copy_bw else None, "one_gpu": one_gpu}


def sweep(args, comm, mpi, extra, show):
    """Time every (size, algorithm, input mode) point and the host MPI round
    trip of each size; ``show(row)`` gets each row as soon as it is measured."""
    dtype = np.dtype(DTYPES[args.dtype])
    world = comm.world
    stream = _hip.Stream()
    copy_bw = extra["copy_bandwidth_GBps"] and extra["copy_bandwidth_GBps"] * 1e9
    largest = largest_message(args)
    x = pyar.empty((largest // dtype.itemsize,), dtype, stream=stream, ipc=True)  # registered
    y = pyar.empty_like(x)
    x.set(exact.exact_inputs(x.size, mpi.Get_rank()).astype(dtype), stream=stream)
    comm.register(x)
    host = HostRoundTrip(mpi, x.size, dtype)
    plan = [(algo, "registered") for algo in args.algos]
    if args.staged:
        plan.append(("auto", "staged"))
    if args.graph:
        plan.append(("auto", "graph"))
    staged_x = pyar.empty_like(x) if args.staged else None
    if staged_x is not None:
        _hip.memcpy_dtod(staged_x.ptr, x.ptr, x.nbytes, stream)
    rows = []
    for nbytes in doubling(args.min, largest, args.factor):
        count = max(1, nbytes // dtype.itemsize)
        moved = count * dtype.itemsize
        iterations = args.iters or measure.iterations_for(nbytes)
        dst = measure.prefix(y, count)
        expected = exact.expected_sum(count, world) if args.check else None

        def row(algo, mode, seconds):
            wrong = exact.wrong_on_all_ranks(mpi, dst, expected, stream) if args.check else None
            return report.row(moved, count, args.dtype, algo, mode, seconds,
                              2 * (world - 1) / world, wrong)

        src = measure.prefix(x, count)
        _hip.memset(dst.ptr, 0, dst.nbytes, stream)  # a stale right answer cannot pass
        baseline = measure.time_per_call(mpi, host.call(src.ptr, dst.ptr, count, stream),
                                         iterations, args.warmup, stream)
        rows.append(row("mpi", "host", baseline))
        show(rows[-1])
        for algo, mode in plan:
            source = staged_x if mode == "staged" else x
            src = measure.prefix(source, count)
            if mode != "staged" and count != x.size:
                comm.register(src)
            _hip.memset(dst.ptr, 0, dst.nbytes, stream)
            seconds = _time_point(args, comm, mpi, src, dst, algo, mode, iterations, stream)
            chosen = algorithms.choose(moved, world) if algo == "auto" else algo
            rows.append(row(f"auto:{chosen}" if algo == "auto" else chosen, mode, seconds))
            rows[-1]["vs_mpi"] = seconds / baseline
            if copy_bw:
                total = traffic.shared_gpu_bytes(chosen, moved, world, mode == "staged")
                rows[-1]["hbm_eff"] = total / seconds / copy_bw
            show(rows[-1])
    stream.close()
    return rows


def _time_point(args, comm, mpi, src, dst, algo, mode, iterations, stream):
    if mode == "graph":
        with comm.capture(stream) as graph:
            for _ in range(GRAPH_CALLS):
                comm.allreduce(src, out=dst, algo=algo, stream=stream)
        seconds = measure.time_per_call(
            mpi, lambda: graph.replay(stream), max(1, iterations // GRAPH_CALLS),
            1, stream) / GRAPH_CALLS
        graph.close()
    else:
        seconds = measure.time_per_call(
            mpi, lambda: comm.allreduce(src, out=dst, algo=algo, stream=stream),
            iterations, args.warmup, stream)
    comm.synchronize(stream)
    return seconds


def point_count(args, local_world=None, on_device=False):
    """How many rows a run prints (for the progress bar); ``on_device``:
    across nodes, with the device data path's rows."""
    if args.fused:
        return 2 * len(args.quants) * len(args.tokens)
    largest = largest_message(args)
    if args.latency:
        return latency.point_count(len(list(doubling(args.min, largest, args.factor))))
    if args.node_size is None:
        per_size = 1 + len(args.algos) + args.staged + args.graph
    else:
        per_size = nodes.points_per_size(local_world, on_device, DTYPES[args.dtype])
    return per_size * len(list(doubling(args.min, largest, args.factor)))


def largest_message(args):
    """--max, rounded down to whole 16-byte packs (at least one)."""
    dtype = np.dtype(DTYPES[args.dtype])
    return args.max - args.max % (dtype.itemsize * 16) or dtype.itemsize * 16


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    mpi = MPI.COMM_WORLD
    diagnostics.exit_unless_ready(mpi, "python -m pyar.bench")
    if mpi.Get_size() < 2:
        raise SystemExit("python -m pyar.bench: run under mpirun with at least 2 ranks")
    leader = mpi.Get_rank() == 0
    # Across nodes this communicator takes the host data path; the device
    # path's rows (nodes.sweep) get a communicator of their own.
    with pyar.Communicator(mpi, max_size=args.max_size, node_size=args.node_size,
                           inter_node="host") as comm:
        across = isinstance(comm, HierarchicalCommunicator)
        if args.node_size is not None and not across:
            raise SystemExit(f"python -m pyar.bench: --node-size {args.node_size} leaves all "
                             f"{comm.world} ranks in one IPC domain; pick a smaller one")
        on_device = across and nodes.measures_device_path(comm, mpi)
        extra = _environment(comm, mpi)
        device = _hip.Device(comm.device)
        what = (f"pyar allreduce_rmsnorm (fused) vs all-reduce + add_rmsnorm + quantize "
                f"(unfused), hidden {args.hidden}" if args.fused else
                f"pyar all-reduce across nodes, {nodes.heading(comm, on_device)}" if across else
                "pyar all-reduce latency: forced algorithms against an empty kernel"
                if args.latency else "pyar all-reduce")
        title = (f"{what}, {comm.world} ranks on "
                 f"{'one shared ' if extra['one_gpu'] else ''}{device.name} ({device.arch}), "
                 f"{args.dtype}")
        shape = fused if args.fused else latency if args.latency else report
        table, cells = shape.table(), shape.cells
        progress = Progress(point_count(args, comm.local.world if across else None, on_device),
                            enabled=leader and not args.no_progress)
        if leader:
            print(f"## {title}\n\n{table.header()}", flush=True)

        def show(row):
            if leader:
                progress.print(table.row(cells(row)))
                progress.step()

        if args.fused:
            rows = fused.sweep(args, comm, mpi, extra["copy_bandwidth_GBps"] and
                               extra["copy_bandwidth_GBps"] * 1e9, show)
        elif across:
            rows = nodes.sweep(args, comm, mpi, largest_message(args), show, on_device)
        elif args.latency:
            rows = latency.sweep(
                args, comm, mpi, largest_message(args), show, GRAPH_CALLS,
                lambda *point: _time_point(args, comm, mpi, *point))
        else:
            rows = sweep(args, comm, mpi, extra, show)
        progress.close()
        meta = {"world": comm.world, "platform": _hip.platform(), "device": device.name,
                "arch": device.arch, "host": socket.gethostname(), "dtype": args.dtype,
                "max_size": comm.max_size, "mpi_gpu_aware": diagnostics.mpi_gpu_aware(),
                **extra}
        if across:
            meta.update(node_size=comm.local.world, domains=comm.domains)
    wrong = sum(row.get("wrong") or 0 for row in rows)
    if leader:
        if not args.fused:
            print(f"\n{nodes.LEGEND if across else shape.LEGEND}")
        if extra["copy_bandwidth_GBps"]:
            print(f"device-to-device copy bandwidth (read + write): "
                  f"{extra['copy_bandwidth_GBps']:.0f} GB/s; hbm_eff = bytes all ranks' kernels "
                  f"must move / time / copy bandwidth")
        if args.json:
            report.save_json(args.json, meta, rows)
        if args.plot:
            report.save_plot(args.plot, rows, title)
            print(f"plot: {args.plot}")
        if wrong:
            print(f"FAILED: {wrong} wrong elements in all (the 'wrong' column)", file=sys.stderr)
    if wrong:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
