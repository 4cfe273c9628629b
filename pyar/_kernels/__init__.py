"""Code objects compiled from src/kernels at build time, loaded per device.

``load("allreduce")`` returns the pyar._hip.Module of src/kernels/allreduce.cu
for the current device: the ``.fatbin`` on CUDA, the ``.hsaco`` on ROCm.
"""
import os
import threading

from pyar import _hip

_SUFFIX = {"cuda": ".fatbin", "hip": ".hsaco"}
_TOOL = {"cuda": "nvcc", "hip": "hipcc"}
_DIRECTORY = os.path.dirname(os.path.abspath(__file__))
_modules: dict = {}  # (name, device ordinal) -> Module
_lock = threading.Lock()


class KernelsNotBuiltError(RuntimeError):
    """pyar was built without code objects for the platform in use."""


def file_name(name):
    """The file name of code object ``name`` for the loaded platform."""
    return name + _SUFFIX[_hip.platform()]


def path(name):
    """Where the code object ``name`` for the loaded platform lives."""
    platform = _hip.platform()
    file = os.path.join(_DIRECTORY, file_name(name))
    if not os.path.isfile(file):
        raise KernelsNotBuiltError(
            f"pyar was built without {platform} kernels ({file} is missing): reinstall with "
            f"{_TOOL[platform]} on PATH, or set PYAR_GPU_ARCHS to include this GPU's arch")
    return file


def load(name, device=None):
    """The Module ``name`` for ``device`` (default: current), loaded once."""
    ordinal = _hip.get_device() if device is None else int(device)
    key = (name, ordinal)
    with _lock:
        module = _modules.get(key)
        if module is None:
            _hip.set_device(ordinal)
            with open(path(name), "rb") as f:
                module = _hip.Module.from_bytes(f.read(), source=name)
            _modules[key] = module
    return module
