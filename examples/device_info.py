"""Print what pyar sees: runtime, devices, and a self-test launch.

    python examples/device_info.py
"""
import numpy as np

import pyar
from pyar import _kernels


def main():
    print(f"pyar {pyar.__version__} on {pyar.platform()} "
          f"(runtime {pyar._hip.runtime_version()}, library {pyar._hip.library_path()})")
    for ordinal in range(pyar.get_device_count()):
        device = pyar.Device(ordinal)
        free, total = device.memory_info()
        print(f"  device {ordinal}: {device.name} [{device.arch}], "
              f"{device.multiprocessor_count} multiprocessors, {total / 2**30:.0f} GiB "
              f"({free / 2**30:.0f} free), PCI {device.pci_bus_id}")
    module = _kernels.load("test_kernels")
    axpy = module.get_function("pyar_test_axpy_f32", ("ptr", "ptr", "float32", "uint64"))
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    dx, dy = pyar.asarray(x), pyar.asarray(np.ones_like(x))
    axpy.launch(4, 256, (dy, dx, 2.0, x.size))
    ok = np.array_equal(dy.get(), 2.0 * np.ones_like(x) + x)
    print(f"self-test launch through hipModuleLaunchKernel: {'OK' if ok else 'FAILED'}")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
