"""rmsnorm_fused.py's unfused mode: algo="unfused" (the steps as separate
kernels) against the float64 reference and bitwise against the two-stage
kernel.

Ranks run under mpirun, one GPU a rank; importing needs no GPU.
"""
import pyar
from allreduce_common import DTYPES
from rmsnorm_fused_common import (
    EPS, FP8, KINDS, Checker, digest, group_size, host, random_inputs, setup,
)


UNFUSED_SHAPES = [(7, 2880), (300, 4096), (3, 16384)]


def unfused_mode(sc):
    """algo="unfused" (what "auto" runs past the fused crossover): the
    all-reduce, then the single-GPU add + RMSNorm (+ quantization) kernel;
    its outputs within the float64 reference's bounds and bitwise those of
    the fused two-stage kernel, with out and with only a quantized output."""
    comm, _, (stream, _) = setup(sc, max_size=1 << 20)
    check = Checker(sc)
    calls = differences = 0
    for d, dtype in enumerate(DTYPES):
        for shape_index, (tokens, hidden) in enumerate(UNFUSED_SHAPES):
            s64, abs_sum, residual, weight, x_dev, w_dev = random_inputs(
                sc, dtype, tokens, hidden, (d, shape_index, 7), stream)
            for kind in KINDS:
                for with_out in (True, False) if kind else (True,):
                    hashes = {}
                    for algo in ("twostage", "unfused"):
                        res_dev = pyar.asarray(residual, stream=stream)
                        got = comm.allreduce_rmsnorm(
                            x_dev, res_dev, w_dev, EPS,
                            out=pyar.empty((tokens, hidden), dtype, stream=stream)
                            if with_out else None,
                            residual_out=pyar.empty_like(res_dev), stream=stream, quant=kind,
                            algo=algo, group_size=group_size(hidden),
                            fp8_dtype=None if kind is None or kind == "mxfp4" else FP8)
                        comm.synchronize(stream)
                        y, r = host(got.out, stream), host(got.residual_out, stream)
                        q, scales = host(got.quantized, stream), host(got.scales, stream)
                        what = f"{dtype.name} {tokens}x{hidden} {kind} {algo} out={with_out}"
                        group = group_size(hidden) if kind == "fp8_per_group" else None
                        check.outputs(what, dtype, s64, abs_sum, residual, weight, y, r, kind,
                                      q, scales, group)
                        hashes[algo] = digest(y, r, q, scales)
                        calls += 1
                    if hashes["twostage"] != hashes["unfused"]:
                        differences += 1
                        check.fail(what, "unfused outputs differ from the two-stage kernel's")
    sc.report(test="fused-unfused", calls=calls, mismatches=sc.sum(check.failed),
              variant_differences=sc.sum(differences))
    comm.close()
