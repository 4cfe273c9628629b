"""Print what pyar sees (``python -m pyar``), then launch a self-test kernel
on every visible GPU through hipModuleLaunchKernel.

    python examples/device_info.py

Exits with status 1, saying why, where pyar cannot run.
"""
import numpy as np

import pyar
from pyar import _kernels
from pyar.__main__ import main as report


def self_test(ordinal):
    """y = 2 x + y on GPU ``ordinal`` with pyar's test kernel; True when exact."""
    pyar.set_device(ordinal)
    module = _kernels.load("test_kernels", ordinal)
    axpy = module.get_function("pyar_test_axpy_f32", ("ptr", "ptr", "float32", "uint64"))
    x = np.random.default_rng(ordinal).standard_normal(1000).astype(np.float32)
    dx, dy = pyar.asarray(x), pyar.asarray(np.ones_like(x))
    axpy.launch(4, 256, (dy, dx, 2.0, x.size))
    return np.array_equal(dy.get(), 2.0 * np.ones_like(x) + x)


def main():
    status = report()
    if status != 0:
        raise SystemExit(status)
    results = [self_test(ordinal) for ordinal in range(pyar.get_device_count())]
    for ordinal, ok in enumerate(results):
        print(f"self-test launch on device {ordinal}: {'OK' if ok else 'FAILED'}")
    raise SystemExit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
