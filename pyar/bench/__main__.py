"""python -m pyar.bench: sweep message sizes and algorithms, print tables.

Run under mpirun: ``mpirun -n 4 python -m pyar.bench --max 256M``; with
``--fused``, the fused all-reduce + RMSNorm against the unfused steps per
token count instead (``--hidden``, ``--tokens``, ``--quant``).
"""
import argparse
import socket
import sys

import ml_dtypes
import numpy as np
from mpi4py import MPI

import pyar
from pyar import _hip
from pyar.bench import fused, measure, report, traffic
from pyar.comm import algorithms

DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
GRAPH_CALLS = 20  # all-reduces per captured graph in --graph rows


def parse_size(text):
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = text[-1] if text and text[-1] in UNITS else ""
    return int(float(text[:len(text) - len(unit)]) * UNITS[unit])


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m pyar.bench", description=__doc__)
    parser.add_argument("--min", type=parse_size, default=parse_size("1K"), help="smallest message")
    parser.add_argument("--max", type=parse_size, default=parse_size("256M"), help="largest message")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--algos", default="auto,oneshot,twoshot",
                        help="comma-separated: auto, oneshot, twoshot")
    parser.add_argument("--staged", action="store_true",
                        help="also time auto with staged (copied) input")
    parser.add_argument("--graph", action="store_true",
                        help=f"also time auto replayed from a graph of {GRAPH_CALLS} calls")
    parser.add_argument("--max-size", type=parse_size, default=parse_size("64M"),
                        help="communicator scratch size")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=0, help="calls per point (0: by size)")
    parser.add_argument("--json", help="write results here")
    parser.add_argument("--plot", help="write a PNG plot here")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--fused", action="store_true",
                        help="time allreduce_rmsnorm against the unfused steps instead")
    parser.add_argument("--hidden", type=int, default=4096, help="--fused: hidden size")
    parser.add_argument("--tokens", type=fused.parse_tokens, default=fused.DEFAULT_TOKENS,
                        help="--fused: comma-separated token counts")
    parser.add_argument("--quant", default="none,fp8_per_token",
                        help=f"--fused: comma-separated, of {', '.join(fused.QUANT_CHOICES)}")
    args = parser.parse_args(argv)
    args.dtype_value = DTYPES[args.dtype]
    try:
        args.quants = fused.parse_quants(args.quant)
    except ValueError as exc:
        parser.error(str(exc))
    if not args.tokens or min(args.tokens) < 1:
        parser.error("--tokens needs positive token counts")
    args.algos = [algorithms.validate(a.strip()) for a in args.algos.split(",") if a.strip()]
    if args.min <= 0 or args.max < args.min:
        parser.error("need 0 < --min <= --max")
    return args


def sizes(smallest, largest):
    size = smallest
    while size <= largest:
        yield size
        size *= 2


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


def sweep(args, comm, mpi):
    dtype = np.dtype(DTYPES[args.dtype])
    world = comm.world
    stream = _hip.Stream()
    extra = _environment(comm, mpi)
    copy_bw = extra["copy_bandwidth_GBps"] and extra["copy_bandwidth_GBps"] * 1e9
    largest = args.max - args.max % (dtype.itemsize * 16) or dtype.itemsize * 16
    x = pyar.empty((largest // dtype.itemsize,), dtype, stream=stream)
    y = pyar.empty_like(x)
    rng = np.random.default_rng(mpi.Get_rank())
    x.set(rng.standard_normal(x.size).astype(dtype), stream=stream)
    comm.register(x)
    plan = [(algo, "registered") for algo in args.algos]
    if args.staged:
        plan.append(("auto", "staged"))
    if args.graph:
        plan.append(("auto", "graph"))
    points = [(s, a, m) for s in sizes(args.min, largest) for a, m in plan]
    rows = []
    staged_x = pyar.empty_like(x) if args.staged else None
    if staged_x is not None:
        _hip.memcpy_dtod(staged_x.ptr, x.ptr, x.nbytes, stream)
    for index, (nbytes, algo, mode) in enumerate(points):
        count = max(1, nbytes // dtype.itemsize)
        source = staged_x if mode == "staged" else x
        src = source if count == source.size else _prefix(source, count)
        dst = y if count == y.size else _prefix(y, count)
        if mode != "staged" and count != x.size:
            comm.register(src)
        chosen = algorithms.choose(count * dtype.itemsize, world) if algo == "auto" else algo
        iterations = args.iters or measure.iterations_for(nbytes)
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
        moved = count * dtype.itemsize
        algbw = moved / seconds / 1e9
        hbm = None
        if copy_bw:
            total = traffic.shared_gpu_bytes(chosen, moved, world, mode == "staged")
            hbm = total / seconds / copy_bw
        rows.append({"bytes": moved, "count": count, "dtype": args.dtype, "algo": chosen
                     if algo != "auto" else f"auto:{chosen}", "mode": mode,
                     "time_us": seconds * 1e6, "algbw_GBps": algbw,
                     "busbw_GBps": algbw * 2 * (world - 1) / world, "hbm_eff": hbm})
        if mpi.Get_rank() == 0 and not args.no_progress:
            done = index + 1
            bar = "#" * (30 * done // len(points))
            print(f"\r[{bar:<30}] {done}/{len(points)}", end="", file=sys.stderr, flush=True)
    if mpi.Get_rank() == 0 and not args.no_progress:
        print(file=sys.stderr)
    stream.close()
    return rows, extra


def _prefix(array, count):
    """The first ``count`` elements of a 1-D device array, as a view."""
    return pyar.DeviceArray.from_pointer(array.ptr, (count,), array.dtype, owner=array,
                                         device=array.device)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    mpi = MPI.COMM_WORLD
    with pyar.Communicator(mpi, max_size=args.max_size) as comm:
        if comm.world < 2:
            raise SystemExit("run under mpirun with at least 2 ranks")
        if args.fused:
            extra = _environment(comm, mpi)
            rows = fused.sweep(args, comm, mpi, extra["copy_bandwidth_GBps"] and
                               extra["copy_bandwidth_GBps"] * 1e9)
        else:
            rows, extra = sweep(args, comm, mpi)
        device = _hip.Device(comm.device)
        meta = {"world": comm.world, "platform": _hip.platform(), "device": device.name,
                "arch": device.arch, "host": socket.gethostname(), "dtype": args.dtype,
                "max_size": comm.max_size, **extra}
    if mpi.Get_rank() == 0:
        what = (f"pyar allreduce_rmsnorm (fused) vs all-reduce + add_rmsnorm + quantize "
                f"(unfused), hidden {args.hidden}" if args.fused else "pyar all-reduce")
        title = (f"{what}, {meta['world']} ranks on "
                 f"{'one shared ' if extra['one_gpu'] else ''}{meta['device']} ({meta['arch']}), "
                 f"{args.dtype}")
        print(fused.table(rows, title) if args.fused else report.table(rows, title))
        if extra["copy_bandwidth_GBps"]:
            print(f"\ndevice-to-device copy bandwidth (read + write): "
                  f"{extra['copy_bandwidth_GBps']:.0f} GB/s; hbm_eff = bytes all ranks' kernels "
                  f"must move / time / copy bandwidth")
        if args.json:
            report.save_json(args.json, meta, rows)
        if args.plot and not args.fused and report.save_plot(args.plot, rows, title):
            print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
