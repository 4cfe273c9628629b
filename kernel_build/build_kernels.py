"""The kernel build: every src/kernels/*.cu for every requested target
(gpu_targets), by the compilers found (cuda_compiler, amd_compiler_choice),
through the cache (compile_cache).

CUDA gives one fatbin per source; ROCm one code object per (source, arch),
bundled per source into a .hsaco (offload_bundle).  Compilations run side
by side, one per core.  The build also writes kernel_resources.md next to
the code objects (kernel_resources), headed by the build's log: pip hides
the build's output, and the log says which compiler built what.
"""
import concurrent.futures
import os
import re
import shutil
import subprocess
import tempfile

from .amd_compiler_choice import amd_compilers, assign_hip_archs
from .build_log import log, logged_lines, start_log
from .compile_cache import Job, cache_folder, run_cached
from .cuda_compiler import find_cuda_compiler, nvcc_command
from .gpu_targets import requested_archs
from .kernel_resources import REPORT_NAME, amd_resources, cuda_resources, resource_report
from .offload_bundle import write_bundle


def build(source_dir, output_dir, defines=(), names=None):
    """Compile every .cu in ``source_dir`` (or those in ``names``) into
    ``output_dir``; returns the code objects made.  ``defines`` are passed to
    every compilation (the test-only builds)."""
    start_log()
    cuda_archs, hip_archs = requested_archs()
    sources = sorted(f for f in os.listdir(source_dir) if f.endswith(".cu")
                     and (names is None or f in names))
    os.makedirs(output_dir, exist_ok=True)
    cache = cache_folder()
    jobs = []  # (output file, job)
    compiler = find_cuda_compiler() if cuda_archs else None
    if cuda_archs and not compiler:
        log("nvcc not found: no CUDA kernels built (put nvcc on PATH, set CUDA_HOME, or "
            "install NVIDIA's compiler wheels: pip install '.[cuda]')")
    if compiler:
        nvcc = compiler.path
        version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
        release = re.search(r"release (\d+\.\d+)", version)
        label = f"nvcc {release.group(1)}" if release else "nvcc"
        log(f"CUDA compiler: {label} ({nvcc}) {compiler.origin}")
        for name in sources:
            jobs.append((name[:-3] + ".fatbin", Job(
                os.path.join(source_dir, name), ",".join(cuda_archs), label,
                compiler.identity(version),
                lambda s, o: nvcc_command(nvcc, s, o, cuda_archs, defines),
                stable=compiler.stable)))
    with tempfile.TemporaryDirectory() as device_libs:
        compilers = amd_compilers(hip_archs, device_libs) if hip_archs else []
        if hip_archs and not compilers:
            log("no AMD compiler (ROCm's hipcc, clang++-19 with rocm-device-libs, hipcc): "
                "no ROCm kernels built")
        chosen = assign_hip_archs(compilers, hip_archs, cache) if compilers else {}
        for name in sources:
            for arch, compiler in chosen.items():
                jobs.append((name[:-3] + ".hsaco", Job(
                    os.path.join(source_dir, name), arch, compiler.short_name(),
                    compiler.identity(),
                    lambda s, o, c=compiler, a=arch: c.command(s, o, a, defines),
                    compiler.environment, compiler.stable)))
        # the biggest sources first: they are the longest compilations
        jobs.sort(key=lambda item: -os.path.getsize(item[1].source))
        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            futures = [pool.submit(run_cached, job, cache) for _, job in jobs]
            entries = [future.result() for future in futures]  # the first failure raises
    made, bundles, results = [], {}, []
    for (output, job), entry in zip(jobs, entries):
        with open(os.path.join(entry, "log")) as f:
            text = f.read()
        path = os.path.join(output_dir, output)
        if output.endswith(".fatbin"):
            shutil.copyfile(os.path.join(entry, "output"), path)
            made.append(path)
            rows = cuda_resources(text)
            for arch in cuda_archs:
                results.append((output[:-7], arch, job.compiler,
                                [r for r in rows if r["arch"] == arch]))
        else:
            with open(os.path.join(entry, "output"), "rb") as f:
                bundles.setdefault(path, {})[job.target] = f.read()
            results.append((output[:-6], job.target, job.compiler, amd_resources(text)))
    for path, code_objects in bundles.items():
        write_bundle(path, code_objects)
        made.append(path)
    if not made:
        log("no GPU toolchain: pyar is built without kernels")
        return made
    table, summary = resource_report(results)
    for line in summary:
        log(line)
    with open(os.path.join(output_dir, REPORT_NAME), "w") as f:
        f.write("# The kernel build\n\n" + "".join(f"    {line}\n" for line in logged_lines())
                + "\n# Registers and spills per kernel\n\n" + table)
    log(f"registers and spills of every kernel: {os.path.join(output_dir, REPORT_NAME)}")
    return sorted(made)
