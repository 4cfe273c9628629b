"""Running a test scenario under mpirun and collecting what its ranks report.

A scenario is a Python file in tests/mpi/; each rank prints lines
``PYAR-RESULT <json>`` for the suite's summary and exits non-zero on failure.
Under run_scenario the same lines also go to a file of their own
($PYAR_RESULT_FILE), which is what the tests read: mpirun's forwarding of a
rank's output can lose its last lines when the rank exits right after them.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULT_PREFIX = "PYAR-RESULT "
RESULT_FILE = "PYAR_RESULT_FILE"


# Where a CUDA-aware Open MPI is installed (scripts/cuda_aware_openmpi.sh of
# the mpi branch builds one): the device data path's tests run under it.
CUDA_AWARE_MPI = "PYAR_TEST_CUDA_AWARE_MPI"


def mpirun_command(nranks, path=None):
    """mpirun (or mpiexec) found on ``path`` (default: $PATH) for ``nranks``."""
    mpirun = shutil.which("mpirun", path=path) or shutil.which("mpiexec", path=path)
    if mpirun is None:
        raise RuntimeError("mpirun not found: install Open MPI (openmpi-bin)")
    return [mpirun, "-n", str(nranks), "--oversubscribe", "--bind-to", "none"]


def run_scenario(scenario, nranks, *args, timeout=600, env=None):
    """Run tests/mpi/<scenario>.py on ``nranks`` ranks; returns (stdout, results).

    Fails with the ranks' output when any rank fails or the run times out.
    """
    script = os.path.join(HERE, "mpi", scenario + ".py")
    full_env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
                    PYTHONUNBUFFERED="1", OMPI_ALLOW_RUN_AS_ROOT="1",
                    OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
    full_env.update(env or {})
    command = mpirun_command(nranks, full_env.get("PATH")) + [sys.executable, script,
                                                               *map(str, args)]
    with tempfile.TemporaryDirectory(prefix="pyar-results-") as folder:
        full_env[RESULT_FILE] = os.path.join(folder, "results.jsonl")
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                                  env=full_env, cwd=ROOT)
        except subprocess.TimeoutExpired as exc:
            keep_log(command, "timed out", exc.stdout, exc.stderr)
            raise AssertionError(f"{scenario} on {nranks} ranks timed out after {timeout} s:\n"
                                 f"{exc.stdout}\n{exc.stderr}") from None
        keep_log(command, f"exit {done.returncode}", done.stdout, done.stderr)
        if done.returncode != 0:
            raise AssertionError(f"{scenario} on {nranks} ranks failed (exit {done.returncode}):"
                                 f"\n{done.stdout[-20000:]}\n{done.stderr[-20000:]}")
        results = read_results(full_env[RESULT_FILE])
    record(results)
    return done.stdout, results


def read_results(path):
    """The rows the ranks wrote to ``path`` (report), in the order they wrote them."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def cuda_aware_mpi_env():
    """The environment that runs mpirun and its ranks (mpi4py included: the
    4.1 series keeps libmpi.so.40's ABI) on the CUDA-aware Open MPI at
    $PYAR_TEST_CUDA_AWARE_MPI, with device buffers on: the ob1 PML, the
    smcuda BTL (CUDA IPC between the ranks of a machine) and
    opal_cuda_support on.  None when the variable is unset."""
    prefix = os.environ.get(CUDA_AWARE_MPI)
    if not prefix:
        return None
    if not os.access(os.path.join(prefix, "bin", "mpirun"), os.X_OK):
        raise RuntimeError(f"{CUDA_AWARE_MPI}={prefix!r}: no bin/mpirun there")
    library_path = os.environ.get("LD_LIBRARY_PATH")
    return {"OPAL_PREFIX": prefix,
            "PATH": os.path.join(prefix, "bin") + os.pathsep + os.environ.get("PATH", ""),
            "LD_LIBRARY_PATH": os.path.join(prefix, "lib") + (
                os.pathsep + library_path if library_path else ""),
            "OMPI_MCA_pml": "ob1", "OMPI_MCA_btl": "self,smcuda",
            "OMPI_MCA_opal_cuda_support": "1"}


def keep_log(command, outcome, stdout, stderr):
    """Append a scenario's whole output to $PYAR_SCENARIO_LOG, so that a run
    cut short by its time limit still tells what each scenario printed."""
    path = os.environ.get("PYAR_SCENARIO_LOG")
    if not path:
        return
    as_text = [s.decode(errors="replace") if isinstance(s, bytes) else (s or "")
               for s in (stdout, stderr)]
    with open(path, "a") as f:
        f.write(f"=== {' '.join(command[-3:])}: {outcome}\n{as_text[0]}\n{as_text[1]}\n")


def record(results):
    """Append results to $PYAR_RESULTS (JSON lines) for the GPU runner's summary."""
    path = os.environ.get("PYAR_RESULTS")
    if path and results:
        with open(path, "a") as f:
            for result in results:
                f.write(json.dumps(result) + "\n")


def report(**fields):
    """Called inside a scenario: one result line for the summary, printed and, under
    run_scenario, appended to $PYAR_RESULT_FILE (one write of a whole line, so lines of
    ranks that report at once do not interleave)."""
    line = json.dumps(fields)
    print(RESULT_PREFIX + line, flush=True)
    path = os.environ.get(RESULT_FILE)
    if path:
        descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(descriptor, (line + "\n").encode())
        finally:
            os.close(descriptor)


def control_build(kernels_path):
    """The name of the control build at ``kernels_path`` (its folder, tests/gpu/conftest.py's
    CONTROL_BUILDS key, less the number tmp_path_factory appends): a positive control
    reports it, so that two controls running one scenario mode against different builds
    (a missing start barrier, a late staging copy) stay two rows in the summary."""
    return os.path.basename(os.path.normpath(kernels_path)).rstrip("0123456789")
