"""``python -m pyar.bench --fused``: the fused all-reduce + residual add +
RMSNorm (+ quantization) against the same steps unfused -- pyar's all-reduce,
then a separate add + RMSNorm kernel, then a separate quantization kernel --
per token count, eager and replayed from graphs, measured in the same run.

Rows also time each fused variant forced (one-stage, two-stage, split, and
lamport where its slots and kernels take the input): the crossovers that
``algorithms.FUSED_ONESTAGE_MAX_BYTES``, ``FUSED_MAX_BYTES``, ``FUSED_LARGE``
and ``LAMPORT_MAX_BYTES`` encode (``SHARED_GPU_FUSED`` for ranks sharing a
GPU) come from them.  On one shared GPU the fused kernel's HBM efficiency
is reported: the bytes it must move (traffic.fused_shared_gpu_bytes) over
its time, against the device-to-device copy bandwidth; so is that of the
unfused path's add + RMSNorm kernel timed alone, every rank's at once
(``norm_us``, ``norm_eff``: the single-GPU row kernel that the unfused
baseline stands on).

``allreduce_us`` times the unfused path's all-reduce step alone (what
``"auto"`` runs), and ``bound`` is ``unfused_us / allreduce_us``: the
speedup of a fused kernel that cost no more than that all-reduce.  A fused
kernel moves the same data between the ranks and cannot norm a row before
its sum is complete, so where ``bound`` is below a speedup target, a fused
kernel no faster than pyar's all-reduce cannot reach it (an estimate: a
fused kernel on a faster protocol than the all-reduce's could).
"""
import numpy as np

import pyar
from pyar import _hip
from pyar.bench import measure, traffic
from pyar.bench.table import Table
from pyar.comm import algorithms, fused_plan, row_kernels

GRAPH_CALLS = 20
FORCED = (*algorithms.FUSED_VARIANTS, algorithms.SPLIT, algorithms.LAMPORT)  # timed forced
DEFAULT_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
QUANT_CHOICES = ("none", *row_kernels.QUANT_KINDS)


def parse_tokens(text):
    return tuple(int(t) for t in text.split(",") if t.strip())


def parse_quants(text):
    kinds = [q.strip() for q in text.split(",") if q.strip()]
    for kind in kinds:
        if kind not in QUANT_CHOICES:
            raise ValueError(f"--quant: {kind!r} is not one of {', '.join(QUANT_CHOICES)}")
    return kinds


class Buffers:
    """One rank's arrays for the largest token count; calls use leading rows."""

    def __init__(self, tokens, hidden, dtype, kind, stream, seed):
        rng = np.random.default_rng(seed)
        shape = (tokens, hidden)
        self.x = pyar.asarray(rng.standard_normal(shape, np.float32).astype(dtype), stream=stream,
                              ipc=True)  # registered
        self.residual = pyar.asarray(rng.standard_normal(shape, np.float32).astype(dtype),
                                     stream=stream)
        self.weight = pyar.asarray(np.ones(hidden, dtype), stream=stream)
        self.s = pyar.empty(shape, dtype, stream=stream)
        self.y = pyar.empty(shape, dtype, stream=stream)
        self.r = pyar.empty(shape, dtype, stream=stream)
        self.kind = kind
        self.q_width, self.q_dtype, self.scale_width, self.scale_dtype = quant_shapes(
            kind, hidden)
        self.q = pyar.empty((tokens, self.q_width), self.q_dtype, stream=stream)
        self.scales = pyar.empty((tokens, self.scale_width), self.scale_dtype, stream=stream)

    def rows(self, name, tokens):
        a = getattr(self, name)
        return pyar.DeviceArray.from_pointer(a.ptr, (tokens,) + a.shape[1:], a.dtype, owner=a,
                                             device=a.device)


def quant_shapes(kind, hidden):
    """(width, dtype) of the quantized rows and of the scales of ``kind``
    (fp8_per_group: the default groups of 128)."""
    if kind == "mxfp4":
        return hidden // 2, np.dtype(np.uint8), hidden // 32, np.dtype(np.uint8)
    groups = hidden // 128 if kind == "fp8_per_group" else 1
    return hidden, row_kernels.FP8_DTYPES[0], groups, np.dtype(np.float32)


def sweep(args, comm, mpi, copy_bw, show):
    """Rows of per-token-count timings for every --quant kind; ``show(row)``
    gets each row as soon as it is measured."""
    dtype = np.dtype(args.dtype_value)
    stream = _hip.Stream()
    rows = []
    for kind_name in args.quants:
        kind = None if kind_name == "none" else kind_name
        buffers = Buffers(max(args.tokens), args.hidden, dtype, kind, stream, mpi.Get_rank())
        for tokens in args.tokens:
            for row in _point(args, comm, mpi, stream, buffers, kind, tokens, dtype, copy_bw):
                rows.append(row)
                show(row)
    stream.close()
    return rows


def _point(args, comm, mpi, stream, b, kind, tokens, dtype, copy_bw):
    x, res, w = b.rows("x", tokens), b.rows("residual", tokens), b.weight
    s, y, r = b.rows("s", tokens), b.rows("y", tokens), b.rows("r", tokens)
    q, scales = (b.rows("q", tokens), b.rows("scales", tokens)) if kind else (None, None)
    comm.register(x)
    quantization = dict(quant=kind, fp8_dtype=row_kernels.FP8_DTYPES[0] if kind and
                        kind != "mxfp4" else None, quantized=q, scales=scales)
    nbytes = x.nbytes
    iterations = args.iters or measure.iterations_for(nbytes * comm.world)
    row_bytes, row_layout = args.hidden * dtype.itemsize, comm.kernels.rows.layout
    chosen = fused_plan.variant(comm.geometry, row_layout, nbytes, row_bytes)
    lamport_fits = fused_plan.lamport_refusal(row_layout, comm.geometry.lamport_bytes, nbytes,
                                              row_bytes) is None

    def fused(algo="auto"):
        comm.allreduce_rmsnorm(x, res, w, out=y, residual_out=r, stream=stream, algo=algo,
                               **quantization)

    def norm():
        row_kernels.add_rmsnorm(s, res, w, out=y, residual_out=r, stream=stream)

    def allreduce():
        comm.allreduce(x, out=s, stream=stream)

    def unfused():
        allreduce()
        norm()
        if kind:
            row_kernels.quantize(y, kind, fp8_dtype=quantization["fp8_dtype"], quantized=q,
                             scales=scales, stream=stream)

    def eager(run):
        return measure.time_per_call(mpi, run, iterations, args.warmup, stream)

    def graphed(run):
        with comm.capture(stream) as graph:
            for _ in range(GRAPH_CALLS):
                run()
        seconds = measure.time_per_call(mpi, lambda: graph.replay(stream),
                                        max(1, iterations // GRAPH_CALLS), 1, stream)
        graph.close()
        return seconds / GRAPH_CALLS

    out_bytes = y.nbytes + (q.nbytes + scales.nbytes if kind else 0)
    kernel = _kernel_facts(comm, chosen, tokens, args.hidden, dtype, kind)
    results = []
    for mode, timer in (("eager", eager), ("graph", graphed)):
        row = {"tokens": tokens, "hidden": args.hidden, "dtype": str(dtype),
               "quant": kind or "none", "mode": mode, "variant": chosen,
               "fused_us": timer(fused) * 1e6, "unfused_us": timer(unfused) * 1e6, **kernel}
        for variant in FORCED:
            if variant != algorithms.LAMPORT or lamport_fits:
                row[f"{variant}_us"] = timer(lambda: fused(variant)) * 1e6
        row["speedup"] = row["unfused_us"] / row["fused_us"]
        row["allreduce_us"] = timer(allreduce) * 1e6
        row["bound"] = row["unfused_us"] / row["allreduce_us"]
        row["norm_us"] = timer(norm) * 1e6
        row["hbm_eff"] = row["norm_eff"] = None
        if copy_bw:
            moved = traffic.fused_shared_gpu_bytes(chosen, nbytes, out_bytes, comm.world)
            row["hbm_eff"] = moved / (row["fused_us"] / 1e6) / copy_bw
            moved = traffic.add_rmsnorm_shared_gpu_bytes(nbytes, comm.world)
            row["norm_eff"] = moved / (row["norm_us"] / 1e6) / copy_bw
        results.append(row)
    comm.synchronize(stream)
    return results


def _kernel_facts(comm, variant, tokens, hidden, dtype, kind):
    """The fused kernel ``auto`` runs (split: its spinning first kernel): its
    name, launch geometry, registers and local (spill) bytes a thread, and how
    many of its blocks fit on a multiprocessor (kernel None when it runs
    unfused)."""
    if variant not in FORCED:
        return {"kernel": None}
    function, geometry = fused_plan.launch_geometry(comm.geometry, comm.kernels, variant,
                                                    dtype, tokens, hidden, row_kernels.quant_code(kind))
    return {"kernel": function.name, "threads": geometry.threads, "blocks": geometry.blocks,
            "packs_per_thread": geometry.packs_per_thread,
            "blocks_per_sm": function.max_active_blocks_per_multiprocessor(geometry.threads),
            **function.resources}


COLUMNS = [("tokens", 6), ("hidden", 6), ("quant", 13), ("mode", 5), ("variant", 8),
           ("fused_us", 9), ("unfused_us", 10), ("speedup", 7), ("allreduce_us", 12),
           ("bound", 6), ("onestage_us", 11),
           ("twostage_us", 11), ("split_us", 8), ("lamport_us", 10), ("hbm_eff", 7),
           ("norm_us", 8), ("norm_eff", 8)]


def table():
    return Table([name for name, _ in COLUMNS], [width for _, width in COLUMNS])


def cells(row):
    formatted = []
    for name, _ in COLUMNS:
        value = row.get(name)
        if value is None:
            formatted.append(None)
        elif name.endswith("_eff"):
            formatted.append(f"{value:.0%}")
        elif name in ("speedup", "bound"):
            formatted.append(f"{value:.2f}x")
        elif isinstance(value, float):
            formatted.append(f"{value:.2f}")
        else:
            formatted.append(value)
    return formatted
