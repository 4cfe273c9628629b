"""rmsnorm_fused.py's random mode: per-rank random x against the float64
reference built from every rank's input, over every variant, dtype, shape,
quantization and input kind, outputs compared across ranks and variants;
then bad input, which every rank must refuse alike.

Ranks run under mpirun, one GPU a rank; importing needs no GPU.
"""
import ml_dtypes
import numpy as np

import pyar
from allreduce_common import DTYPES
from rmsnorm_fused_common import (
    EPS, FP8, KINDS, Checker, digest, group_size, host, random_inputs, setup,
)


RANDOM_SHAPES = [(1, 4096), (7, 2880), (64, 7168), (300, 4096), (3, 16384), (33, 512)]


def lamport_takes(tokens, hidden, dtype):
    """Whether algo="lamport" takes the input in random mode's communicator:
    rows of one pack (16 bytes) per thread of 1024, inputs within one receive
    segment (the 1 MiB max_size)."""
    row_bytes = hidden * dtype.itemsize
    return row_bytes <= 1024 * 16 and tokens * row_bytes <= 1 << 20


def random_mode(sc):
    comm, _, (stream, _) = setup(sc, max_size=1 << 20)
    check = Checker(sc)
    rows = {}
    calls = 0
    keep = []
    for d, dtype in enumerate(DTYPES):
        for shape_index, (tokens, hidden) in enumerate(RANDOM_SHAPES):
            s64, abs_sum, residual, weight, x_dev, w_dev = random_inputs(
                sc, dtype, tokens, hidden, (d, shape_index), stream)
            for ki, kind in enumerate(KINDS):
                registered = ki % 2 == 1
                if registered:
                    x_reg = pyar.asarray(x_dev.get(stream=stream), stream=stream, ipc=True)
                    comm.register(x_reg)
                    keep.append(x_reg)
                for algo in ("onestage", "twostage", "split", "lamport", "auto"):
                    in_place = algo in ("twostage", "split")
                    res_dev = pyar.asarray(residual, stream=stream)
                    if algo == "lamport" and not lamport_takes(tokens, hidden, dtype):
                        sc.expect_raises(ValueError, lambda: comm.allreduce_rmsnorm(
                            x_dev, res_dev, w_dev, EPS, stream=stream, algo="lamport"),
                            f"{dtype.name} {tokens}x{hidden} lamport", ("algo='lamport'",))
                        continue
                    out = pyar.empty((tokens, hidden), dtype, stream=stream)
                    got = comm.allreduce_rmsnorm(
                        x_reg if registered else x_dev, res_dev, w_dev, EPS, out=out,
                        residual_out=None if in_place else pyar.empty_like(res_dev),
                        stream=stream, quant=kind, algo=algo, group_size=group_size(hidden),
                        fp8_dtype=None if kind is None or kind == "mxfp4" else FP8)
                    comm.synchronize(stream)
                    calls += 1
                    y, r = host(got.out, stream), host(got.residual_out, stream)
                    q, scales = host(got.quantized, stream), host(got.scales, stream)
                    what = f"{dtype.name} {tokens}x{hidden} {kind} {algo} " + \
                        ("registered" if registered else "staged")
                    if in_place and got.residual_out is not res_dev:
                        check.fail(what, "residual_out=None did not update residual in place")
                    group = group_size(hidden) if kind == "fp8_per_group" else None
                    if algo != "split":  # split: two-stage's bits (variant_differences)
                        check.outputs(what, dtype, s64, abs_sum, residual, weight, y, r, kind,
                                      q, scales, group)
                    rows.setdefault((dtype.name, algo), [0, 0])
                    rows[(dtype.name, algo)][0] += 1
                    h = digest(y, r, q, scales)
                    everyone = sc.mpi.allgather(h)
                    if len(set(everyone)) != 1:
                        rows[(dtype.name, algo)][1] += 1
                        check.fail(what, "outputs differ between ranks")
                    rows.setdefault(("variants", what.rsplit(" ", 2)[0] + str(registered)),
                                    set()).add(h)
    variant_differences = sum(1 for k, v in rows.items() if k[0] == "variants" and len(v) != 1)
    sc.check(variant_differences == 0,
             f"{variant_differences} configurations gave different bits in different variants")
    failed = sc.sum(check.failed)
    for (name, algo), value in sorted((k, v) for k, v in rows.items() if k[0] != "variants"):
        sc.report(test="fused-random", dtype=name, algo=algo, calls=value[0],
                  rank_differences=value[1])
    sc.report(test="fused-random-total", calls=calls, mismatches=failed,
              variant_differences=variant_differences)
    bad_input(sc, comm, stream)
    comm.close()
    keep.clear()


def bad_input(sc, comm, stream):
    """Every rank raises the same clear error; nothing is launched."""
    bf16 = np.dtype(ml_dtypes.bfloat16)
    x = pyar.zeros((4, 4096), bf16, stream=stream)
    res = pyar.zeros((4, 4096), bf16, stream=stream)
    w = pyar.zeros((4096,), bf16, stream=stream)
    cases = [
        (TypeError, lambda: comm.allreduce_rmsnorm(pyar.zeros((4, 4096), np.float64), res, w),
         "dtype"),
        (ValueError, lambda: comm.allreduce_rmsnorm(x, pyar.zeros((5, 4096), bf16), w),
         "residual has shape"),
        (ValueError, lambda: comm.allreduce_rmsnorm(x, res, pyar.zeros((2048,), bf16)),
         "weight has shape"),
        (TypeError, lambda: comm.allreduce_rmsnorm(x, pyar.zeros((4, 4096), np.float16), w),
         "residual has dtype"),
        (ValueError, lambda: comm.allreduce_rmsnorm(
            pyar.zeros((4, 20), bf16), pyar.zeros((4, 20), bf16), pyar.zeros((20,), bf16)),
         "hidden size 20"),
        (ValueError, lambda: comm.allreduce_rmsnorm(
            pyar.zeros((1, 32768), bf16), pyar.zeros((1, 32768), bf16),
            pyar.zeros((32768,), bf16)), "hidden size 32768"),
        (ValueError, lambda: comm.allreduce_rmsnorm(x, res, w, out=pyar.zeros((4, 2048), bf16)),
         "out has shape"),
        (ValueError, lambda: comm.allreduce_rmsnorm(x, res, w, out=x), "overlaps"),
        (ValueError, lambda: comm.allreduce_rmsnorm(x, res, w, quant="int4"), "quant"),
        (ValueError, lambda: comm.allreduce_rmsnorm(x, res, w, quant="fp8_per_group",
                                                    group_size=96), "group_size"),
        (ValueError, lambda: comm.allreduce_rmsnorm(
            x, res, w, quant="mxfp4", quantized=pyar.zeros((4, 4096), np.uint8)),
         "quantized has shape"),
        (TypeError, lambda: comm.allreduce_rmsnorm(x, res, w, quant="fp8_per_token",
                                                   fp8_dtype=np.float16), "fp8_dtype"),
        (ValueError, lambda: comm.allreduce_rmsnorm(x, res, w, algo="threestage"), "algo"),
        (TypeError, lambda: comm.allreduce_rmsnorm(np.zeros((4, 4096), bf16), res, w), "host"),
    ]
    raised = 0
    for kinds, call, phrase in cases:
        raised += sc.expect_raises(kinds, call, f"bad input ({phrase})", (phrase,)) is not None
    # The communicator still works afterwards.
    got = comm.allreduce_rmsnorm(x, res, w, stream=stream)
    comm.synchronize(stream)
    sc.check(not np.isnan(got.out.get(stream=stream).astype(np.float32)).any(),
             "a call after the errors returned NaN")
    comm.close()
    sc.expect_raises(ValueError, lambda: comm.allreduce_rmsnorm(x, res, w), "closed",
                     ("closed",))
    sc.report(test="fused-bad-input", cases=len(cases), raised=sc.sum(raised) // sc.world)
