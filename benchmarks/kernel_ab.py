#!/usr/bin/env python3
"""The same calls on two or more kernel builds, timed alternately in one run:
what a change to the kernel sources buys.  Two separate benchmark runs of
one tree can differ by more than the tenths of a microsecond that a change
to a latency-bound kernel moves; builds timed in turn share one run's
conditions.

A build is a folder of the code objects a communicator loads
(``Communicator(kernels=DIR)``: allreduce, allreduce_rmsnorm, shards); each
build gets a communicator of its own.  Every case is captured into a graph
of GRAPH_CALLS calls per build, the graphs replay in turn for ``--repeats``
rounds, and a build's time per call is the median over the rounds of the
slowest rank.  Every build's outputs must equal the first build's bit for
bit (the kernels sum in rank order, so a change that moves no arithmetic
moves no bit): a row that differs is marked and the run exits 1.

    # here (needs nvcc; git for --commit): one build of this tree or of a commit
    python benchmarks/kernel_ab.py --build DIR [--commit REV] [--define NAME=VALUE] [--arch sm_90]
    # on the GPU machine, under mpirun (ranks sharing a GPU need MPS)
    mpirun -n 8 python benchmarks/kernel_ab.py before=DIR1 after=DIR2 \\
        [--allreduce ll:bfloat16:1K,4K] [--fused lamport:bfloat16:4096:1,2:none,fp8_per_token] \\
        [--json out.json]

``--allreduce ALGO:DTYPE:SIZES`` and ``--fused VARIANT:DTYPE:HIDDEN:TOKENS[:QUANTS]``
add cases (each may repeat); without either, DEFAULT_CASES run.
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

GRAPH_CALLS = 20
CODE_OBJECTS = ("allreduce", "allreduce_rmsnorm", "shards")
SOURCES = tuple(name + ".cu" for name in CODE_OBJECTS)
DEFAULT_CASES = (("--allreduce", "ll:bfloat16:1K,4K,16K,64K"),
                 ("--allreduce", "ll:float32:1K,4K"),
                 ("--fused", "lamport:bfloat16:4096:1,2,4,16:none,fp8_per_token"))
QUANTS = ("none", "fp8_per_token", "fp8_per_group", "mxfp4")


def parse_allreduce(spec):
    """[("allreduce", algo, dtype, nbytes)] of ``ALGO:DTYPE:SIZES``."""
    from pyar.bench.sizes import parse_size
    from pyar.comm import algorithms
    parts = spec.split(":")
    if len(parts) != 3:
        raise ValueError(f"--allreduce {spec!r}: expected ALGO:DTYPE:SIZES")
    algo, dtype, sizes = parts
    if algo not in algorithms.ALGORITHMS + algorithms.LL_ALGORITHMS:
        raise ValueError(f"--allreduce {spec!r}: unknown algo {algo!r}")
    return [("allreduce", algo, _dtype(dtype, spec), parse_size(s)) for s in sizes.split(",")]


def parse_fused(spec):
    """[("fused", variant, dtype, hidden, tokens, quant)] of
    ``VARIANT:DTYPE:HIDDEN:TOKENS[:QUANTS]``."""
    from pyar.comm import algorithms
    parts = spec.split(":")
    if len(parts) not in (4, 5):
        raise ValueError(f"--fused {spec!r}: expected VARIANT:DTYPE:HIDDEN:TOKENS[:QUANTS]")
    variant, dtype, hidden, tokens = parts[:4]
    if variant not in algorithms.FUSED_VARIANTS + (algorithms.SPLIT, algorithms.LAMPORT):
        raise ValueError(f"--fused {spec!r}: unknown variant {variant!r}")
    quants = parts[4].split(",") if len(parts) == 5 else ["none"]
    unknown = [q for q in quants if q not in QUANTS]
    if unknown:
        raise ValueError(f"--fused {spec!r}: unknown quantization {unknown}; use {QUANTS}")
    return [("fused", variant, _dtype(dtype, spec), int(hidden), int(t), q)
            for t in tokens.split(",") for q in quants]


def _dtype(name, spec):
    import ml_dtypes
    if name not in ("float32", "float16", "bfloat16"):
        raise ValueError(f"{spec!r}: dtype must be float32, float16 or bfloat16, not {name!r}")
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def parse_builds(texts):
    """{name: folder} of NAME=DIR arguments, each folder holding every code object."""
    builds = {}
    for text in texts:
        name, sep, folder = text.partition("=")
        if not sep or not name or name in builds:
            raise ValueError(f"{text!r}: builds are NAME=DIR, each name once")
        missing = [c for c in CODE_OBJECTS if not os.path.exists(
            os.path.join(folder, c + ".fatbin")) and not os.path.exists(
            os.path.join(folder, c + ".hsaco"))]
        if missing:
            raise ValueError(f"{folder} lacks {missing}: make it with --build")
        builds[name] = folder
    if len(builds) < 2:
        raise ValueError("give at least two builds: the first is the baseline")
    return builds


def build(folder, arch, defines, commit):
    from tests import kernel_builds
    if commit is None:
        made = kernel_builds.build(folder, (arch,), defines, list(SOURCES))
    else:
        made = kernel_builds.build_commit(folder, (arch,), defines, list(SOURCES), commit)
    print(f"built {sorted(made)} of {commit or 'this tree'} for {arch}"
          f"{''.join(' -D' + d for d in defines)} into {folder}")


class Case:
    """One case's inputs, and per communicator its outputs and captured graph."""

    def __init__(self, spec, stream, rng):
        import pyar
        self.spec, self.stream = spec, stream
        if spec[0] == "allreduce":
            _, self.algo, dtype, nbytes = spec
            n = nbytes // dtype.itemsize
            self.x = pyar.asarray(rng.standard_normal(n).astype(dtype), stream=stream)
            self.label = f"allreduce {self.algo} {dtype} {nbytes} B"
        else:
            _, self.algo, dtype, hidden, tokens, quant = spec
            shape = (tokens, hidden)
            self.x = pyar.asarray(rng.standard_normal(shape).astype(dtype), stream=stream)
            self.residual = pyar.asarray(rng.standard_normal(shape).astype(dtype), stream=stream)
            self.weight = pyar.asarray(rng.standard_normal(hidden).astype(dtype), stream=stream)
            self.quant = None if quant == "none" else quant
            self.label = f"{self.algo} {dtype} {tokens} x {hidden} {quant}"

    def capture(self, comm):
        """(graph of GRAPH_CALLS calls on ``comm``, the arrays they write)."""
        import pyar
        from pyar.bench import fused
        from pyar.comm import row_kernels
        s, x = self.stream, self.x
        if self.spec[0] == "allreduce":
            out = pyar.empty_like(x)
            outputs = [out]

            def call():
                comm.allreduce(x, out=out, algo=self.algo, stream=s)
        else:
            y, r = pyar.empty_like(x), pyar.empty_like(x)
            outputs, quant = [y, r], {}
            if self.quant:
                width, q_dtype, scale_width, scale_dtype = fused.quant_shapes(self.quant,
                                                                              x.shape[1])
                q = pyar.empty((x.shape[0], width), q_dtype, stream=s)
                scales = pyar.empty((x.shape[0], scale_width), scale_dtype, stream=s)
                outputs += [q, scales]
                quant = dict(quant=self.quant, quantized=q, scales=scales,
                             fp8_dtype=row_kernels.FP8_DTYPES[0] if self.quant != "mxfp4"
                             else None)

            def call():
                comm.allreduce_rmsnorm(x, self.residual, self.weight, out=y, residual_out=r,
                                       stream=s, algo=self.algo, **quant)
        with comm.capture(s) as graph:
            for _ in range(GRAPH_CALLS):
                call()
        return graph, outputs


def measure(builds, cases, repeats, replays, json_path):
    from mpi4py import MPI

    import pyar
    from pyar.bench import measure as timing, table
    mpi = MPI.COMM_WORLD
    comms = {name: pyar.Communicator(mpi, kernels=folder) for name, folder in builds.items()}
    world, rank = mpi.Get_size(), mpi.Get_rank()
    if world < 2:
        raise SystemExit("run under mpirun with 2 to 8 ranks")
    stream, rng = pyar.Stream(), np.random.default_rng(1000 + rank)  # inputs differ per rank
    base, rows, differ = next(iter(builds)), [], False
    for spec in cases:
        case = Case(spec, stream, rng)
        captured = {name: case.capture(comm) for name, comm in comms.items()}
        samples = {name: [] for name in captured}
        for repeat in range(repeats):
            for name, (graph, _) in captured.items():
                seconds = timing.time_per_call(mpi, lambda: graph.replay(stream), replays,
                                               2 if repeat == 0 else 0, stream)
                samples[name].append(seconds * 1e6 / GRAPH_CALLS)
        bits = {name: [np.asarray(a.get(stream)).view(np.uint8) for a in outputs]
                for name, (_, outputs) in captured.items()}
        row = [world, case.label]
        for name in captured:
            us = statistics.median(samples[name])  # each sample the slowest rank's
            same = mpi.allreduce(all(np.array_equal(a, b) for a, b in zip(bits[base], bits[name])),
                                 op=MPI.LAND)
            differ |= not same
            if name == base:
                base_us = us
                row.append(round(us, 3))
            else:
                row += [round(us, 3), round(us - base_us, 3), "yes" if same else "NO"]
        for graph, _ in captured.values():
            graph.close()
        rows.append(row)
    head = ["world", "case", f"{base} µs"]
    for name in list(builds)[1:]:
        head += [f"{name} µs", f"{name} - {base}", "same bits"]
    if rank == 0:
        print(table.markdown(head, rows, f"kernel builds, graph replay of {GRAPH_CALLS} calls x "
                             f"{replays}, median of {repeats} rounds (slowest rank)"))
        if json_path:
            device = pyar.Device(comms[base].device)
            meta = {"world": world, "device": device.name, "arch": device.arch,
                    "graph_calls": GRAPH_CALLS, "replays": replays, "repeats": repeats}
            with open(json_path, "w") as f:
                json.dump({"meta": meta, "builds": builds, "head": head, "rows": rows}, f,
                          indent=1)
    for comm in comms.values():
        comm.close()
    return 1 if differ else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("builds", nargs="*", metavar="NAME=DIR")
    parser.add_argument("--build", metavar="DIR", help="build the code objects into DIR")
    parser.add_argument("--commit", help="with --build: the kernel sources of this commit")
    parser.add_argument("--define", action="append", default=[], metavar="NAME=VALUE",
                        help="with --build: a preprocessor definition (repeatable)")
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--allreduce", action="append", default=[], metavar="ALGO:DTYPE:SIZES")
    parser.add_argument("--fused", action="append", default=[],
                        metavar="VARIANT:DTYPE:HIDDEN:TOKENS[:QUANTS]")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--replays", type=int, default=50)
    parser.add_argument("--json")
    options = parser.parse_args()
    if options.build:
        build(options.build, options.arch, options.define, options.commit)
        return 0
    try:
        builds = parse_builds(options.builds)
        specs = ([("--allreduce", s) for s in options.allreduce]
                 + [("--fused", s) for s in options.fused]) or DEFAULT_CASES
        cases = [case for flag, spec in specs
                 for case in (parse_allreduce if flag == "--allreduce" else parse_fused)(spec)]
    except ValueError as e:
        parser.error(str(e))
    return measure(builds, cases, options.repeats, options.replays, options.json)


if __name__ == "__main__":
    sys.exit(main())
