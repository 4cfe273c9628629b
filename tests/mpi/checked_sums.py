"""Random all-reduce inputs and their float64 reference: every rank
regenerates every rank's input from the seed, so it checks its own result
without communicating (the bound is allreduce_random.py's)."""
import numpy as np

from allreduce_common import normal
from allreduce_random import tolerance_scale


class RandomSum:
    """Rank ``rank``'s input of ``n`` elements for ``key``, among ``world``
    ranks, and what the sum must be within."""

    def __init__(self, dtype, n, rank, world, *key):
        inputs = [normal(dtype, n, *key, r) for r in range(world)]
        self.mine = inputs[rank]
        self.reference = np.sum([x.astype(np.float64) for x in inputs], axis=0)
        scale, tiny = tolerance_scale(np.dtype(dtype), world)
        self.bound = scale * np.sum([np.abs(x.astype(np.float64)) for x in inputs], axis=0) + tiny

    def wrong(self, got):
        """How many elements of ``got`` (a host array) are beyond the bound
        (NaN included)."""
        err = np.abs(got.astype(np.float64).reshape(self.reference.shape) - self.reference)
        return int(np.count_nonzero(~(err <= self.bound)))
