"""The sizes a sweep visits, each with what timing it needs: the element
count and the bytes that count moves, the iterations, the prefixes of the
input and output arrays, and the exact sum to check the output against."""
from typing import NamedTuple, Optional

import numpy as np

from pyar.bench import exact, measure
from pyar.bench.sizes import doubling


class Point(NamedTuple):
    elements: int
    moved: int
    iterations: int
    src: object
    dst: object
    expected: Optional[np.ndarray]


def points(args, x, y, largest, world):
    """A Point per size from ``args.min`` to ``largest`` (``args.factor``
    apart), over the 1-D arrays ``x`` (input) and ``y`` (output)."""
    for nbytes in doubling(args.min, largest, args.factor):
        count = max(1, nbytes // x.dtype.itemsize)
        yield Point(count, count * x.dtype.itemsize,
                    args.iters or measure.iterations_for(nbytes),
                    measure.prefix(x, count), measure.prefix(y, count),
                    exact.expected_sum(count, world) if args.check else None)
