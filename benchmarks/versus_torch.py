#!/usr/bin/env python3
"""pyar's all-reduce against NCCL and torch symmetric memory, measured in the
same run, one GPU per rank:

    mpirun -n 8 python benchmarks/versus_torch.py --json out.json --plot out.png

Per size (1 KiB to 256 MiB by default) and mode (eager, and replayed from a
graph of GRAPH_CALLS calls), every rank times:

  pyar        Communicator.allreduce, algo="auto", input registered (zero-copy)
  nccl        torch.distributed.all_reduce (NCCL), in place
  symm-1shot  torch.ops.symm_mem.one_shot_all_reduce on a symmetric buffer
  symm-2shot  torch.ops.symm_mem.two_shot_all_reduce_ on a symmetric buffer

and a call's time is the slowest rank's.  The table gives time, algbw and
busbw (nccl-tests' definitions) per implementation and pyar's busbw over
NCCL's and over the faster symmetric-memory kernel's (above 1: pyar faster).

NVLink multicast stays off for every baseline: NCCL_NVLS_ENABLE=0 and
TORCH_SYMM_MEM_DISABLE_MULTICAST=1 are set before torch is imported, and no
multimem kernel is timed.  Before timing, each implementation reduces integer
inputs whose sums bfloat16 holds exactly, and its output must be exact.

pyar itself never imports torch; this script does, as a baseline only.
"""
import argparse
import json
import os
import socket
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

GRAPH_CALLS = 20
IMPLEMENTATIONS = ("pyar", "nccl", "symm-1shot", "symm-2shot")
MODES = ("eager", "graph")
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}


def parse_args(argv):
    from pyar.bench.sizes import parse_size
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--min", type=parse_size, default=parse_size("1K"))
    parser.add_argument("--max", type=parse_size, default=parse_size("256M"))
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=0, help="calls per point (0: by size)")
    parser.add_argument("--json", help="write results here")
    parser.add_argument("--plot", help="write a PNG plot here")
    args = parser.parse_args(argv)
    if args.min < 16 or args.max < args.min:
        parser.error("need 16 <= --min <= --max")
    from pyar.bench.report import can_plot
    if args.plot and not can_plot():
        parser.error("--plot needs matplotlib, which is not installed: "
                     "pip install 'pyar[plot]' (or matplotlib)")
    return args


# --- the table: no GPU needed ---------------------------------------------------------

def bandwidths(nbytes, seconds, world):
    """algbw and busbw in GB/s, as nccl-tests defines them for all-reduce."""
    if seconds is None:
        return None, None
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * 2 * (world - 1) / world


def summarize(nbytes, mode, times, world):
    """One row from seconds per call by implementation (None: not measured)."""
    row = {"bytes": nbytes, "mode": mode}
    for name in IMPLEMENTATIONS:
        seconds = times.get(name)
        algbw, busbw = bandwidths(nbytes, seconds, world)
        row[name] = {"time_us": None if seconds is None else seconds * 1e6,
                     "algbw_GBps": algbw, "busbw_GBps": busbw}
    pyar = times.get("pyar")
    symm = [times[n] for n in ("symm-1shot", "symm-2shot") if times.get(n) is not None]
    row["pyar_over_nccl"] = _speedup(pyar, times.get("nccl"))
    row["pyar_over_symm"] = _speedup(pyar, min(symm) if symm else None)
    return row


def _speedup(mine, theirs):
    """pyar's busbw over the baseline's: the baseline's time over pyar's."""
    if mine is None or theirs is None:
        return None
    return theirs / mine


def table(rows, title):
    from pyar.bench.sizes import human_bytes
    from pyar.bench.table import markdown
    head = ["size", "mode"] + [f"{n} us" for n in IMPLEMENTATIONS] + \
        [f"{n} busbw" for n in IMPLEMENTATIONS] + ["pyar/nccl", "pyar/symm"]
    cells = [[human_bytes(row["bytes"]), row["mode"]]
             + [_number(row[n]["time_us"]) for n in IMPLEMENTATIONS]
             + [_number(row[n]["busbw_GBps"]) for n in IMPLEMENTATIONS]
             + [_number(row["pyar_over_nccl"], ".2f"), _number(row["pyar_over_symm"], ".2f")]
             for row in rows]
    return markdown(head, cells, title) + (
        "\n\nbusbw in GB/s; pyar/nccl and pyar/symm: pyar's busbw over the baseline's "
        "(the faster symmetric-memory kernel's), above 1 when pyar is faster")


def _number(value, spec=".3g"):
    return "-" if value is None else format(value, spec)


def save_plot(path, rows, title):
    from pyar.bench.report import plot_latency
    series = {}
    for row in rows:
        for name in IMPLEMENTATIONS:
            if row[name]["time_us"] is not None:
                series.setdefault(f"{name} ({row['mode']})", []).append(
                    (row["bytes"], row[name]["time_us"]))
    plot_latency(path, series, title)


# --- measuring: one GPU per rank -------------------------------------------------------

class Torch:
    """NCCL and symmetric memory through torch, on this rank's GPU."""

    def __init__(self, mpi, device, largest):
        for name, value in MULTICAST_OFF.items():
            os.environ[name] = value
        import torch
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem
        self.torch, self.dist = torch, dist
        torch.cuda.set_device(device)
        port = mpi.bcast(_free_port() if mpi.Get_rank() == 0 else None)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}",
                                rank=mpi.Get_rank(), world_size=mpi.Get_size(),
                                device_id=torch.device("cuda", device))
        self.group = dist.group.WORLD.group_name
        count = largest // 2
        self.x = torch.empty(count, dtype=torch.bfloat16, device="cuda")
        self.symm = symm_mem.empty(count, dtype=torch.bfloat16, device="cuda")
        symm_mem.rendezvous(self.symm, self.group)
        self.stream = torch.cuda.Stream()

    def call(self, name, count):
        ops = self.torch.ops.symm_mem
        if name == "nccl":
            view = self.x[:count]
            return lambda: self.dist.all_reduce(view)
        view = self.symm[:count]
        if name == "symm-1shot":
            return lambda: ops.one_shot_all_reduce(view, "sum", self.group)
        return lambda: ops.two_shot_all_reduce_(view, "sum", self.group)

    def output_of(self, name, result, count):
        """Host copy (as float) of what a call of ``name`` produced."""
        if name == "nccl":
            return self.x[:count].float().cpu().numpy()
        if name == "symm-2shot":
            return self.symm[:count].float().cpu().numpy()
        return result.float().cpu().numpy()

    def fill(self, name, values):
        target = self.x if name == "nccl" else self.symm
        target[:values.size].copy_(self.torch.from_numpy(values.astype("float32")))

    def time(self, mpi, run, iterations, warmup, graph):
        torch = self.torch
        with torch.cuda.stream(self.stream):
            if graph:
                captured = torch.cuda.CUDAGraph()
                run()  # NCCL and symm-mem set up lazily, outside the capture
                torch.cuda.synchronize()
                with torch.cuda.graph(captured, stream=self.stream):
                    for _ in range(GRAPH_CALLS):
                        run()
                step, iterations, warmup = captured.replay, max(1, iterations // GRAPH_CALLS), 1
            else:
                step = run
            for _ in range(warmup):
                step()
            torch.cuda.synchronize()
            mpi.Barrier()
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                enable_timing=True)
            start.record()
            for _ in range(iterations):
                step()
            stop.record()
            stop.synchronize()
        seconds = start.elapsed_time(stop) / 1e3 / iterations / (GRAPH_CALLS if graph else 1)
        return mpi.allreduce(seconds, op=_mpi_max())

    def close(self):
        self.dist.destroy_process_group()


def _mpi_max():
    from mpi4py import MPI
    return MPI.MAX


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import ml_dtypes
    import numpy as np
    from mpi4py import MPI

    import pyar
    from pyar import _hip, diagnostics
    from pyar.bench import measure
    from pyar.bench.exact import exact_inputs, expected_sum
    from pyar.bench.sizes import doubling
    bf16 = np.dtype(ml_dtypes.bfloat16)
    mpi = MPI.COMM_WORLD
    diagnostics.exit_unless_ready(mpi, "versus_torch.py")
    rank, world = mpi.Get_rank(), mpi.Get_size()
    if world < 2:
        raise SystemExit("run under mpirun with at least 2 ranks, one GPU each")
    comm = pyar.Communicator(mpi, max_size=64 << 20)
    bus_ids = mpi.allgather(_hip.Device(comm.device).pci_bus_id)
    if len(set(bus_ids)) != world:
        raise SystemExit("NCCL needs one GPU per rank; these ranks share GPUs: "
                         f"{bus_ids}")
    largest = args.max - args.max % 16
    baselines = Torch(mpi, comm.device, largest)
    stream = _hip.Stream()
    x = pyar.empty((largest // 2,), bf16, stream=stream, ipc=True)  # registered
    y = pyar.empty_like(x)
    rows, failures = [], {}
    for nbytes in doubling(args.min, largest):
        count = nbytes // 2
        src = pyar.DeviceArray.from_pointer(x.ptr, (count,), bf16, owner=x, device=x.device)
        dst = pyar.DeviceArray.from_pointer(y.ptr, (count,), bf16, owner=y, device=y.device)
        comm.register(src)
        want = expected_sum(count, world)
        iterations = args.iters or measure.iterations_for(nbytes)
        for mode in MODES:
            times = {}
            src.set(exact_inputs(count, rank).astype(bf16), stream=stream)
            comm.allreduce(src, out=dst, stream=stream)
            if not np.array_equal(dst.get(stream=stream).astype(np.float32), want):
                raise SystemExit(f"pyar gave a wrong sum at {nbytes} bytes")
            if mode == "graph":
                with comm.capture(stream) as graph:
                    for _ in range(GRAPH_CALLS):
                        comm.allreduce(src, out=dst, stream=stream)
                times["pyar"] = measure.time_per_call(
                    mpi, lambda: graph.replay(stream), max(1, iterations // GRAPH_CALLS), 1,
                    stream) / GRAPH_CALLS
                graph.close()
            else:
                times["pyar"] = measure.time_per_call(
                    mpi, lambda: comm.allreduce(src, out=dst, stream=stream), iterations,
                    args.warmup, stream)
            comm.synchronize(stream)
            for name in IMPLEMENTATIONS[1:]:
                times[name] = _baseline(baselines, mpi, name, count, want, rank, iterations,
                                        args.warmup, mode == "graph", failures)
            rows.append(summarize(nbytes, mode, times, world))
    baselines.close()
    device = _hip.Device(comm.device)
    meta = {"world": world, "device": device.name, "arch": device.arch,
            "host": socket.gethostname(), "dtype": "bfloat16", "bus_ids": bus_ids,
            "multicast_off": MULTICAST_OFF, "failures": failures}
    comm.close()
    if rank == 0:
        title = f"pyar vs NCCL vs torch symmetric memory, {world} x {device.name}, bfloat16"
        print(table(rows, title))
        for name, error in failures.items():
            print(f"{name}: not measured where '-': {error}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"meta": meta, "rows": rows}, f, indent=1)
        if args.plot:
            save_plot(args.plot, rows, title)
            print(f"plot: {args.plot}")


def _baseline(baselines, mpi, name, count, want, rank, iterations, warmup, graph, failures):
    """Seconds per call of baseline ``name``, after checking its sum; None
    (and the reason in ``failures``) where it refuses the size or the graph."""
    import numpy as np
    try:
        baselines.fill(name, exact_inputs(count, rank))
        run = baselines.call(name, count)
        result = run()
        if not np.array_equal(baselines.output_of(name, result, count), want):
            raise RuntimeError(f"wrong sum at {2 * count} bytes")
        seconds = baselines.time(mpi, run, iterations, warmup, graph)
        error = None
    except Exception as exc:  # a baseline's limits are reported, not fatal
        seconds, error = None, f"{type(exc).__name__}: {exc}"
    # Every rank must skip together, or the next collective would hang.
    errors = mpi.allgather(error)
    if any(errors):
        failures.setdefault(f"{name} ({'graph' if graph else 'eager'})",
                            next(e for e in errors if e))
        return None
    return seconds


if __name__ == "__main__":
    main()
