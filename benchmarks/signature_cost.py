#!/usr/bin/env python3
"""What the call signature at the start barrier costs (issue 17): the shipped
all-reduce kernel against the same kernel built from a commit before the
signature existed, both launched on one communicator, replayed from graphs
and timed alternately in the same run.

The older kernel runs on a communicator of its own, whose Signal area is
zeroed after its one staging call: its Signal layout (32-bit flags, then
epochs) is not today's (64-bit flags, the start flag carrying the call's
digest), while CommState, the input table and the error record's first words
are unchanged.  Both communicators stage the same input.

    # here (needs nvcc and git): the kernels of a commit before the signature
    python benchmarks/signature_cost.py --build-baseline DIR [--commit 8979203] [--arch sm_90]
    # on the GPU machine, under mpirun (ranks sharing a GPU need MPS)
    mpirun -n 8 python benchmarks/signature_cost.py --baseline DIR [--bytes 1024] [--json out.json]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

BASELINE_COMMIT = "8979203"  # main before the signature
GRAPH_SIZE = 20


def build_baseline(out_dir, commit, arch):
    """Compile the commit's allreduce.cu (with its own headers) into out_dir."""
    os.environ["PYAR_GPU_ARCHS"] = arch
    import setup_kernels
    with tempfile.TemporaryDirectory() as tree:
        archive = os.path.join(tree, "src.tar")
        subprocess.run(["git", "-C", ROOT, "archive", "-o", archive, commit, "src/kernels"],
                       check=True)
        with tarfile.open(archive) as tar:
            tar.extractall(tree, filter="data")
        made = setup_kernels.build(os.path.join(tree, "src", "kernels"), out_dir,
                                   names=["allreduce.cu"])
    print(f"built {', '.join(made)} of {commit} into {out_dir}")


def _timed(comm, graph, stream, replays, hip):
    """GPU µs per all-reduce over ``replays`` replays of ``graph``."""
    start, end = hip.Event(), hip.Event()
    comm._node.Barrier()
    start.record(stream)
    for _ in range(replays):
        graph.replay()
    end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (replays * GRAPH_SIZE)


def measure(options):
    from mpi4py import MPI

    import pyar
    import pyar._hip as hip
    from pyar.bench import table
    from pyar.comm import layout

    comm = pyar.Communicator(MPI.COMM_WORLD)
    world, rank = comm.world, comm.rank
    if world < 2:
        raise SystemExit("run under mpirun with 2 to 8 ranks")
    stream = pyar.Stream()
    count = options.bytes // 4
    x = pyar.asarray(np.full(count, rank + 1, np.float32), stream=stream)
    out = pyar.empty((count,), np.float32, stream=stream)
    comm.allreduce(x, out=out, stream=stream)  # stages x into the scratch the graphs read
    old_comm = pyar.Communicator(MPI.COMM_WORLD)
    old_comm.allreduce(x, out=out, stream=stream)  # the same, for the older kernel
    stream.synchronize()
    comm._node.Barrier()  # every rank's staging call is done before its Signal is cleared
    hip.memset(old_comm._buffer.ptr, 0, old_comm._layout.signal_bytes)
    hip.device_synchronize()
    comm._node.Barrier()

    shipped = comm._function("twoshot" if options.algo == "twoshot" else "oneshot", x.dtype)
    old_module = hip.Module.from_file(os.path.join(options.baseline, "allreduce.fatbin"))
    old = old_module.get_function(
        f"pyar_allreduce_{options.algo.replace('shot', '_shot')}_f32_w{world}",
        ("ptr", "uint64", "ptr", "ptr", "uint64", "uint64", "uint32"))
    work = count // 4 if options.algo == "oneshot" else -(-count // 4 // world)
    blocks = min(comm._max_blocks, max(1, -(-work // comm._layout.threads)))
    # Both read the scratch as the first calls staged it (the shipped kernel
    # stages nothing: its input to stage is 0).
    common = (comm._staged_table.ptr, 0, 0, out.ptr, comm._state.ptr, count, comm._timeout_ns)
    old_common = (old_comm._staged_table.ptr, 0, out.ptr, old_comm._state.ptr, count,
                  old_comm._timeout_ns)
    signature = layout.signature(options.algo, count, x.dtype, registered=False)
    launches = {
        "with signature": lambda: shipped.launch(blocks, comm._layout.threads,
                                                 (*common, signature, 0), stream=stream),
        "without (baseline)": lambda: old.launch(blocks, comm._layout.threads,
                                                 (*old_common, 0), stream=stream),
    }
    graphs = {}
    for name, launch in launches.items():
        with hip.capture(stream) as graph:
            for _ in range(GRAPH_SIZE):
                launch()
        graphs[name] = graph
    samples = {name: [] for name in graphs}
    for name, graph in graphs.items():  # warm-up
        _timed(comm, graph, stream, 5, hip)
    for _ in range(options.repeats):
        for name, graph in graphs.items():
            samples[name].append(_timed(comm, graph, stream, options.replays, hip))
    expected = world * (world + 1) / 2
    wrong = int(np.count_nonzero(out.get(stream) != expected))
    comm.synchronize(stream)
    medians = {name: comm._node.allreduce(statistics.median(v), op=MPI.MAX)
                for name, v in samples.items()}
    wrong = comm._node.allreduce(wrong)
    if rank == 0:
        base = medians["without (baseline)"]
        rows = [{"world": world, "bytes": options.bytes, "algo": options.algo, "kernel": name,
                 "us_per_call": round(us, 3), "minus_baseline_us": round(us - base, 3),
                 "wrong": wrong} for name, us in medians.items()]
        print(table.markdown(list(rows[0]), [list(r.values()) for r in rows],
                             f"start-barrier signature cost, graph replay of {GRAPH_SIZE} "
                             f"launches x {options.replays}, median of {options.repeats} "
                             "(slowest rank)"))
        if options.json:
            with open(options.json, "w") as f:
                json.dump({"rows": rows, "baseline_commit": options.commit}, f, indent=1)
    for graph in graphs.values():
        graph.close()
    old_comm.close()
    comm.close()
    return 0 if wrong == 0 else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build-baseline", metavar="DIR")
    parser.add_argument("--commit", default=BASELINE_COMMIT)
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--baseline", metavar="DIR", help="the --build-baseline output")
    parser.add_argument("--bytes", type=int, default=1024)
    parser.add_argument("--algo", choices=("oneshot", "twoshot"), default="oneshot")
    parser.add_argument("--replays", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--json")
    options = parser.parse_args()
    if options.build_baseline:
        build_baseline(options.build_baseline, options.commit, options.arch)
        return 0
    if not options.baseline:
        parser.error("give --baseline DIR (made by --build-baseline) or --build-baseline DIR")
    return measure(options)


if __name__ == "__main__":
    sys.exit(main())
