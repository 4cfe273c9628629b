#!/usr/bin/env python3
"""What the call signature at the start barrier costs (issue 17), piece by
piece: the shipped all-reduce kernel against the same kernel built from a
commit before the signature existed, from the commit before the start
barrier read the state once a call, from the commit before only a
disagreement stored the full signature, from the commit before a flag equal
to the rank's own passed unjudged, from the commit before the kernels'
bounds let all peer loads of a pack go out at once, and from today's
sources without one piece each (pyar_protocol.h's test macros); all
launched in one run, replayed from graphs and timed alternately.

With ``--algo ll`` or ``ll_twoshot`` it prices the LL kernels' signature
instead (their flags carry the call's digest, and a packet or start flag of
another digest ends a wait): no older commit has them, so only the rows of
today's sources run, each LL call planned as the communicator plans it, and
the baseline is the build without the signature.

Every kernel built from today's sources, and the older ones of
PREVIOUS_COMMIT (the same Signal layout; no input to stage), STORED_COMMIT,
JUDGED_COMMIT and BOUNDED_COMMIT, runs on one communicator.  The kernel of
BASELINE_COMMIT runs on a communicator of its own, whose Signal area is
zeroed after its one staging call: its Signal layout (32-bit flags, then
epochs) is not today's (64-bit flags, the start flag carrying the call's
digest), while CommState, the input table and the error record's first words
are unchanged.  Both communicators stage the same input; every kernel writes
an output of its own, checked after the run.

    # here (needs nvcc and git): every kernel below into DIR/<row>/allreduce.fatbin
    python benchmarks/signature_cost.py --build-baseline DIR [--arch sm_90]
    # on the GPU machine, under mpirun (ranks sharing a GPU need MPS)
    mpirun -n 8 python benchmarks/signature_cost.py --baseline DIR [--bytes 1024] [--json out.json]
"""
import argparse
import json
import os
import statistics
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

BASELINE_COMMIT = "8979203"  # main before the signature
PREVIOUS_COMMIT = "c766338"  # the start barrier before it read the state once a call
STORED_COMMIT = "04a5638"    # before only a disagreement stored the full signature
JUDGED_COMMIT = "9cf71ec"    # before begin hashed the digest and an equal flag passed unjudged
BOUNDED_COMMIT = "26fee32"   # before two blocks' registers let a pack's peer loads go at once
GRAPH_SIZE = 20
SHIPPED = "shipped"
# The rows: folder under DIR -> (commit, or None for this tree; test-only defines).
KERNELS = {
    BASELINE_COMMIT: (BASELINE_COMMIT, ()),
    PREVIOUS_COMMIT: (PREVIOUS_COMMIT, ()),
    STORED_COMMIT: (STORED_COMMIT, ()),
    JUDGED_COMMIT: (JUDGED_COMMIT, ()),
    BOUNDED_COMMIT: (BOUNDED_COMMIT, ()),
    SHIPPED: (None, ()),
    "no-signature": (None, ("PYAR_TEST_NO_SIGNATURE=1",)),
    "no-idle-fill": (None, ("PYAR_TEST_NO_IDLE_FILL=1",)),
    "no-failure-latch": (None, ("PYAR_TEST_NO_FAILURE_LATCH=1",)),
}


def build_kernels(out_dir, arch):
    """allreduce.cu of every row of KERNELS into out_dir/<row>."""
    from tests import kernel_builds
    for name, (commit, defines) in KERNELS.items():
        folder = os.path.join(out_dir, name)
        if commit is None:
            kernel_builds.build(folder, (arch,), defines, ["allreduce.cu"])
        else:
            kernel_builds.build_commit(folder, (arch,), defines, ["allreduce.cu"], commit)
        print(f"built {name} ({commit or 'this tree'}{''.join(' -D' + d for d in defines)}) "
              f"into {folder}")


def _timed(mpi, graph, stream, replays, hip):
    """GPU µs per all-reduce over ``replays`` replays of ``graph`` (the ranks of
    ``mpi`` start together)."""
    start, end = hip.Event(), hip.Event()
    mpi.Barrier()
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
    from pyar.comm import algorithms, kernels, layout, plan

    ll = options.algo in algorithms.LL_ALGORITHMS
    builds = {name: spec for name, spec in KERNELS.items() if not ll or spec[0] is None}
    base_row = "no-signature" if ll else BASELINE_COMMIT
    missing = [name for name in builds
               if not os.path.exists(os.path.join(options.baseline, name, "allreduce.fatbin"))]
    if missing:
        raise SystemExit(f"{options.baseline} lacks {missing}: build it with --build-baseline")
    mpi = MPI.COMM_WORLD  # the communicators' ranks: one node
    comm = pyar.Communicator(mpi)
    world, rank = comm.world, comm.rank
    if world < 2:
        raise SystemExit("run under mpirun with 2 to 8 ranks")
    stream = pyar.Stream()
    count = options.bytes // 4
    x = pyar.asarray(np.full(count, rank + 1, np.float32), stream=stream)
    outs = {name: pyar.empty((count,), np.float32, stream=stream) for name in builds}
    old_comm = None
    if ll:
        refusal = plan.ll_refusal(options.algo, comm.geometry.ll_bytes, world, x, outs[SHIPPED])
        if refusal:
            raise SystemExit(f"--bytes {options.bytes}: {refusal}")
    else:
        # A barrier one-shot stages x into the scratch the barrier rows read ("auto"
        # runs LL); the oldest kernel's communicator is staged the same way.
        old_comm = pyar.Communicator(mpi)
        for staging in (comm, old_comm):
            staging.allreduce(x, out=outs[SHIPPED], algo="oneshot", stream=stream)
        stream.synchronize()
        mpi.Barrier()  # every rank's staging call is done before its Signal is cleared
        # The Signal area is the start of the communicator's buffer, up to its scratch.
        signal_bytes = layout.KernelLayout(old_comm.load_module("allreduce")).signal_bytes
        hip.memset(old_comm.geometry.scratch - signal_bytes, 0, signal_bytes)
    for out in outs.values():  # a row that writes nothing cannot pass as right
        hip.memset(out.ptr, 0, out.nbytes)
    hip.device_synchronize()
    mpi.Barrier()

    modules = {name: hip.Module.from_file(os.path.join(options.baseline, name,
                                                       "allreduce.fatbin"))
               for name in builds}

    def launcher(name):
        # The oldest kernel: its own communicator, no signature parameter; the
        # rows of today's source and of the commits since STORED_COMMIT also
        # take the input to stage (0: all read the scratch as the first calls
        # staged it).
        oldest = name == BASELINE_COMMIT
        stages = KERNELS[name][0] not in (BASELINE_COMMIT, PREVIOUS_COMMIT)
        on = (old_comm if oldest else comm).geometry
        entry = f"pyar_allreduce_{options.algo.replace('shot', '_shot')}_f32_w{world}"
        threads = comm.geometry.threads
        work = count // 4 if options.algo == "oneshot" else -(-count // 4 // world)
        blocks = min(comm.geometry.allreduce_blocks, max(1, -(-work // threads)))
        signature = layout.signature(options.algo, count, x.dtype, registered=False)
        kernel = modules[name].get_function(
            entry, ("ptr", "uint64", *(("ptr",) if stages else ()), "ptr", "ptr", "uint64",
                    "uint64", *(() if oldest else ("uint64",)), "uint32"))
        arguments = (on.staged_table, 0, *((0,) if stages else ()), outs[name].ptr,
                     on.state, count, on.timeout_ns,
                     *(() if oldest else (signature,)), 0)
        return lambda: kernel.launch(blocks, threads, arguments, stream=stream)

    def ll_launcher(name):
        # The launch the planner makes for this call, with this row's kernel.
        step = plan.ll(comm.geometry, kernels.KernelSet(world, modules[name], None, None),
                       x, outs[name], options.algo)
        return lambda: step.function.launch(step.grid, step.block, (*step.args, 0),
                                            stream=stream)

    graphs = {}
    for name in builds:
        launch = (ll_launcher if ll else launcher)(name)
        with hip.capture(stream) as graph:
            for _ in range(GRAPH_SIZE):
                launch()
        graphs[name] = graph
    samples = {name: [] for name in graphs}
    for name, graph in graphs.items():  # warm-up
        _timed(mpi, graph, stream, 5, hip)
    for _ in range(options.repeats):
        for name, graph in graphs.items():
            samples[name].append(_timed(mpi, graph, stream, options.replays, hip))
    expected = world * (world + 1) / 2
    wrong = {name: int(np.count_nonzero(out.get(stream) != expected))
             for name, out in outs.items()}
    comm.synchronize(stream)
    medians = {name: mpi.allreduce(statistics.median(v), op=MPI.MAX)
               for name, v in samples.items()}
    wrong = {name: mpi.allreduce(w) for name, w in wrong.items()}
    if rank == 0:
        base, shipped = medians[base_row], medians[SHIPPED]
        rows = [{"world": world, "bytes": options.bytes, "algo": options.algo, "kernel": name,
                 "us_per_call": round(us, 3), "minus_baseline_us": round(us - base, 3),
                 "minus_shipped_us": round(us - shipped, 3), "wrong": wrong[name]}
                for name, us in medians.items()]
        print(table.markdown(list(rows[0]), [list(r.values()) for r in rows],
                             ("LL signature cost" if ll else "start-barrier cost by piece")
                             + f", graph replay of {GRAPH_SIZE} "
                             f"launches x {options.replays}, median of {options.repeats} "
                             f"(slowest rank); baseline {base_row}: "
                             + ("today's sources without the signature" if ll
                                else "before the signature")))
        if options.json:
            with open(options.json, "w") as f:
                json.dump({"rows": rows, "baseline_row": base_row,
                           "baseline_commit": BASELINE_COMMIT,
                           "previous_commit": PREVIOUS_COMMIT,
                           "stored_commit": STORED_COMMIT,
                           "judged_commit": JUDGED_COMMIT,
                           "bounded_commit": BOUNDED_COMMIT}, f, indent=1)
    for graph in graphs.values():
        graph.close()
    if old_comm is not None:
        old_comm.close()
    comm.close()
    return 0 if not any(wrong.values()) else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build-baseline", metavar="DIR",
                        help="build every row's kernel into DIR/<row> (needs nvcc and git)")
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--baseline", metavar="DIR", help="the --build-baseline output")
    parser.add_argument("--bytes", type=int, default=1024)
    parser.add_argument("--algo", choices=("oneshot", "twoshot", "ll", "ll_twoshot"),
                        default="oneshot")
    parser.add_argument("--replays", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--json")
    options = parser.parse_args()
    if options.build_baseline:
        build_kernels(options.build_baseline, options.arch)
        return 0
    if not options.baseline:
        parser.error("give --baseline DIR (made by --build-baseline) or --build-baseline DIR")
    return measure(options)


if __name__ == "__main__":
    sys.exit(main())
