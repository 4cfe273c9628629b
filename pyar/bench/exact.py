"""Inputs whose all-reduce has one right answer in every supported dtype.

Small integers in [-4, 4]: any partial sum of up to 8 ranks stays within
[-32, 32], which float32, float16 and bfloat16 hold exactly, so the result
must equal the expected sum bit for bit whatever the summation order (the
nccl-tests -c check, without a tolerance)."""
import numpy as np
from mpi4py import MPI

_PERIOD = 9  # element i of rank r is ((7 i + r) mod 9) - 4


def _phase(count):
    return (np.arange(count, dtype=np.uint32) % _PERIOD) * 7 % _PERIOD


def exact_inputs(count, rank):
    """Rank ``rank``'s ``count`` float32 values: different on every rank."""
    return (((_phase(count) + rank) % _PERIOD).astype(np.float32) - 4)


def expected_sum(count, world):
    """The exact sum of ``exact_inputs(count, r)`` over ``world`` ranks."""
    per_phase = np.array([sum((p + r) % _PERIOD - 4 for r in range(world))
                          for p in range(_PERIOD)], np.float32)
    return per_phase[_phase(count)]


def wrong_elements(result, expected):
    """How many elements of ``result`` (a host array) differ from ``expected``
    (``expected_sum`` of its size); NaN is always wrong."""
    got = np.asarray(result).reshape(-1).astype(np.float32)
    if got.shape != expected.shape:
        raise ValueError(f"{got.size} results against {expected.size} expected values")
    return int(np.count_nonzero(got != expected))


def wrong_on_all_ranks(mpi, result, expected, stream):
    """``wrong_elements`` of every rank's device array ``result`` (once
    ``stream`` is done), summed over the ranks of ``mpi``."""
    stream.synchronize()
    return mpi.allreduce(wrong_elements(result.get(), expected), op=MPI.SUM)
