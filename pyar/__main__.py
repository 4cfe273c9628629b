"""python -m pyar: what pyar sees on this machine, and whether it can run.

Prints pyar's version and platform, the GPU runtime library and its version,
every visible device (arch, memory, PCI bus id), the targets of the shipped
code objects and whether each device's arch is among them, the MPI library
(its file, and the pip wheel it came from, if any), whether it is GPU-aware,
and the mpirun on PATH, and the MPS state.  Works without a GPU; exits
with status 0 when pyar can run here and 1, after saying why, when not.
"""
import os
import platform as host_platform
import sys

import pyar
from pyar import _hip, diagnostics


def _format_targets(shipped):
    parts = []
    for flavour, found in sorted(shipped.items()):
        names = [t if isinstance(t, str) else (t[1] if t[0] == "elf" else f"{t[1]} (PTX)")
                 for t in found]
        parts.append(f"{flavour}: {' '.join(names) or 'empty'}")
    return "; ".join(parts) or "none built"


def runtime_lines():
    """The runtime and device lines, and the problem that stops pyar (or None)."""
    try:
        platform = diagnostics.require_runtime()
    except diagnostics.NotReady as problem:
        return ["runtime: none"], problem
    lines = [f"runtime: {platform}, {_hip.library_path()}, version {diagnostics.runtime_version_text()}"]
    try:
        count = diagnostics.require_gpu()
    except diagnostics.NotReady as problem:
        return lines + ["devices: none"], problem
    first_problem = None
    lines.append(f"devices: {count}")
    for ordinal in range(count):
        device = _hip.Device(ordinal)
        _, total = device.memory_info()
        arch = device.arch
        ready = diagnostics.kernels_run_on(platform, arch)
        lines.append(f"  {ordinal}: {device.name}, {arch}, {total / 2**30:.0f} GiB, "
                     f"bus {device.pci_bus_id}, kernels for it: {'yes' if ready else 'NO'}")
        if not ready and first_problem is None:
            try:
                diagnostics.require_kernels(ordinal)
            except diagnostics.NotReady as problem:
                first_problem = problem
    return lines, first_problem


def mpi_lines():
    try:
        from mpi4py import MPI
    except ImportError as exc:
        return [f"MPI: mpi4py cannot be imported ({exc})"]
    library = MPI.Get_library_version().splitlines()[0].split(",")[0].strip()
    awareness = diagnostics.mpi_gpu_awareness()
    verdict = {True: "yes (across nodes pyar hands it device pointers)",
               False: "no (across nodes pyar stages through host memory)",
               None: "unknown (across nodes pyar stages through host memory)"}[awareness.aware]
    return [f"MPI: {library}, MPI {'.'.join(map(str, MPI.Get_version()))}, "
            f"mpi4py {sys.modules['mpi4py'].__version__}; GPU-aware: {verdict}; "
            f"{awareness.why}"] + [f"  {line}" for line in diagnostics.mpi_source().lines()]


def mps_line():
    state = "running" if diagnostics.mps_running() else "not running"
    return (f"MPS: {state} (pipe directory {diagnostics.mps_pipe_directory()}; needed on "
            "NVIDIA when several ranks share a GPU)")


def main():
    print(f"pyar {pyar.__version__} ({os.path.dirname(pyar.__file__)})")
    print(f"python {host_platform.python_version()} on {host_platform.system()} "
          f"{host_platform.machine()}")
    lines, problem = runtime_lines()
    print("\n".join(lines))
    for name in diagnostics.REQUIRED_KERNELS:
        print(f"code objects {name}: {_format_targets(diagnostics.shipped_targets(name))}")
    print("\n".join(mpi_lines()))
    print(mps_line())
    if problem is not None:
        print(f"\nnot ready: {problem}")
        return 1
    print("\nready")
    return 0


if __name__ == "__main__":
    sys.exit(main())
