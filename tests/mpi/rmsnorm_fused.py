"""The fused all-reduce + residual add + RMSNorm (+ quantization) on real ranks.

Modes:
  random        Per-rank random x against a float64 reference built from every
                rank's input: one-stage, two-stage, split, lamport (which
                refuses rows over 16 KiB and inputs over 1 MiB) and auto;
                fp32/fp16/bf16;
                token counts from 1 to 300 (chunked through a 1 MiB scratch),
                hidden sizes 512 to 16384 incl. 2880 and 7168; no quant, FP8
                per token, FP8 per group of 128 and MXFP4; staged and
                registered inputs, residual in place and out of place.
                residual_out within rounding of the float64 sum, y within
                rounding of the norm of the stored residual, quantized output
                after dequantization within the format's rounding and scales
                exactly; outputs bitwise identical across ranks and between
                the variants (split is held to two-stage's bits only: equal
                bits are within the bounds two-stage was checked against).
                Then bad input raises on every rank.
  unfused       algo="unfused" (the steps as separate kernels, what "auto"
                runs past the fused crossover) against the reference and
                bitwise against the two-stage kernel, with and without out.
  adversarial   The seeds' bug provoked for each variant (split, lamport too), like
                allreduce_adversarial.py: rounds of K calls queued with no host
                sync, every caller overwrites its input with NaN right after
                each call while random ranks are delayed or disturbed; staged
                and registered inputs; every output (y, residual_out, FP8 codes
                and scales) compared bit for bit with an undisturbed run.
  wrap          adversarial (one-stage, two-stage, lamport), each (variant,
                input) starting with the epochs WRAP_BEFORE calls before 2**32
                (start_epochs_at): every block crosses the 32-bit wrap under
                the adversarial load.
  control PATH  The same against kernels built without the barrier each
                variant relies on (one-stage: exit, two-stage and split's
                first kernel: mid); runs until
                it sees wrong outputs, within a budget; reports, never fails.
  control-start PATH
                The start barrier's control: kernels built without it
                (PYAR_TEST_SKIP_PHASE=kStart), staged inputs, the last rank
                delayed before every call, so its kernel's copy into its
                scratch lands after the peers read that scratch (also run
                against kernels that copy after their start barrier,
                PYAR_TEST_STAGE_MUTATION=kStageAfterStart); reports, never
                fails.
  control-lamport PATH
                The lamport slots' control: kernels that leave every taken
                pack in the slot (PYAR_TEST_LAMPORT_KEEP_DATA), the last rank
                delayed before every call, so its peers take the rows it
                pushed two calls before; reports, never fails.
  serve         A server's decode loop: graphs captured per (token count,
                hidden) on first use, token counts drawn from 1..256, hidden
                4096 and 7168, CALLS calls replayed with fresh inputs and a
                quantization that depends on the token count; every output
                equal, bit for bit, to the leading rows of an eager call over
                all rows that is checked against the float64 reference.

The modes live in rmsnorm_fused_random.py, rmsnorm_fused_unfused.py,
rmsnorm_fused_adversarial.py and rmsnorm_fused_serve.py, their shared checks
and inputs in rmsnorm_fused_common.py.
"""
from allreduce_common import run
from rmsnorm_fused_adversarial import adversarial_mode, control_mode
from rmsnorm_fused_random import random_mode
from rmsnorm_fused_serve import serve_mode
from rmsnorm_fused_unfused import unfused_mode


def main(sc):
    mode = sc.argv[0] if sc.argv else "random"
    if mode == "random":
        random_mode(sc)
    elif mode == "unfused":
        unfused_mode(sc)
    elif mode in ("adversarial", "wrap"):
        adversarial_mode(sc, wrap=mode == "wrap")
    elif mode in ("control", "control-start", "control-lamport"):
        control_mode(sc, mode, sc.argv[1])
    elif mode == "serve":
        serve_mode(sc)
    else:
        raise SystemExit(f"unknown mode {mode!r}: random | unfused | adversarial | wrap | "
                         "control PATH | control-start PATH | control-lamport PATH | serve")


if __name__ == "__main__":
    run("rmsnorm_fused", main)
