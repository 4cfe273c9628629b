"""Float64 reference of the fused residual add + RMSNorm (``comm.allreduce_rmsnorm``)."""
import numpy as np

from pyar.quant._common import as_float_array


def add_rmsnorm_reference(s, residual, weight, eps=1e-6, round_residual_to=None):
    """Residual add then RMSNorm, in float64.

    ``s`` is the all-reduced input (the sum over ranks of x) and ``residual`` the residual,
    both of shape (tokens, hidden); ``weight`` has shape (hidden,). Any of float16, bfloat16,
    float32 and float64, mixed freely: every input is widened exactly to float64 first.

    Computes, all in float64::

        r = s + residual
        r = r rounded (round to nearest even) to round_residual_to   # only if given
        y = r / sqrt(mean(r**2, axis=-1) + eps) * weight

    and returns ``(y, r)``, both float64 of shape (tokens, hidden).

    ``round_residual_to`` models where the kernel stores the residual: the fused kernel writes
    ``residual_out`` in the residual's dtype, and a kernel that normalizes the stored value
    (as vLLM's fused_add_rms_norm does) computes y from that rounded r. Pass
    ``round_residual_to=residual.dtype`` for those semantics; then the returned r is exactly
    representable in that dtype and is what ``residual_out`` must hold bit for bit (given the
    same s). ``None`` (the default) keeps the unrounded float64 sum. Note that the returned r
    and y are references in float64: a kernel accumulating in float32 differs from them by
    its own rounding, which callers compare within a tolerance.

    Non-finite inputs are not rejected here: they propagate as IEEE arithmetic says.
    """
    where = "add_rmsnorm_reference"
    s = as_float_array("s", where, s, ndim=2)
    residual = as_float_array("residual", where, residual)
    weight = as_float_array("weight", where, weight)
    if residual.shape != s.shape:
        raise ValueError(f"{where}: residual has shape {residual.shape}, s has shape {s.shape}; "
                         "they must match")
    if weight.shape != (s.shape[1],):
        raise ValueError(f"{where}: weight has shape {weight.shape}; expected ({s.shape[1]},) "
                         f"for hidden size {s.shape[1]}")
    if s.shape[1] == 0:
        raise ValueError(f"{where}: hidden size is 0")
    eps = float(eps)
    if not (np.isfinite(eps) and eps >= 0):
        raise ValueError(f"{where}: eps must be finite and >= 0, got {eps!r}")

    r = s.astype(np.float64) + residual.astype(np.float64)
    if round_residual_to is not None:
        target = np.dtype(round_residual_to)
        as_float_array("round_residual_to", where, np.empty(0, target))
        r = r.astype(target).astype(np.float64)
    y = r / np.sqrt(np.mean(r * r, axis=-1, keepdims=True) + eps) * weight.astype(np.float64)
    return y, r
