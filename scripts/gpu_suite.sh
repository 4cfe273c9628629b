#!/usr/bin/env bash
# Tier (b) on the GPU machine, in one command: build pyar, start MPS, run the
# GPU test suite, run the benchmarks, stop MPS, and print the summary table
# last.  Rank r runs on visible GPU r % count: with one GPU every rank shares
# it under MPS; with several (CUDA_VISIBLE_DEVICES picks them) a world no
# larger than their count gets a GPU per rank, and the benchmarks add
# benchmarks/versus_torch.py (NCCL, torch symmetric memory) at those worlds.
#
#   OUT=/tmp/pyar-out scripts/gpu_suite.sh            # everything
#   PYAR_SUITE_TESTS="tests/gpu/test_runtime_launch_gpu.py" PYAR_SUITE_BENCH=0 scripts/gpu_suite.sh
#
# PYAR_SUITE_K selects tests (pytest -k), PYAR_SUITE_BENCH_ARGS adds pyar.bench
# arguments (e.g. "--iters 20"), PYAR_SUITE_FUSED_ARGS those of pyar.bench --fused,
# PYAR_SUITE_BENCH_KINDS picks among "launch allreduce fused nodes versus" (default: all
# that apply), PYAR_SUITE_MPS=0 leaves MPS off; PYAR_SUITE_TEST_SECONDS
# and PYAR_SUITE_BENCH_SECONDS cap the test run and each benchmark run, so a
# leased machine's time limit still leaves room for the summary.
#
# PYAR_SUITE_EXAMPLES=0 skips running the examples (python -m pyar, device_info,
# then allreduce, conjugate_gradient and interop at 4 ranks under MPS, and
# allreduce and conjugate_gradient again across two simulated nodes of 2 ranks,
# PYAR_RANKS_PER_NODE=2).  PYAR_SUITE_NODE_SHAPES lists the "world:node_size"
# runs of pyar.bench --node-size (bench kind "nodes"; default "8:4 8:2").
#
# PYAR_SUITE_PREBUILT_KERNELS=1 builds only the Cython extensions, in place, and
# uses the code objects already in pyar/_kernels (built on another machine with
# the same nvcc and carried along: the GPU machine's minutes are scarce).
#
# PYAR_SUITE_MPI_TARBALL: a CUDA-aware Open MPI packed by scripts/cuda_aware_openmpi.sh,
# for the hierarchical device data path's tests (below).
#
# Outputs in $OUT: build.log, pytest.log, junit.xml, results.jsonl, scenarios.log,
# examples.tsv, examples.log, launch.json, launch_calls_w*.json, bench.json, bench_w8.png,
# nodes_w*x*.png,
# versus_w*.{json,png}, summary.md.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
TESTS=${PYAR_SUITE_TESTS:-tests}
BENCH=${PYAR_SUITE_BENCH:-1}
BENCH_WORLDS=${PYAR_SUITE_BENCH_WORLDS:-2 4 8}
MPS=${PYAR_SUITE_MPS:-1}
TEST_SECONDS=${PYAR_SUITE_TEST_SECONDS:-3600}
BENCH_SECONDS=${PYAR_SUITE_BENCH_SECONDS:-900}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
work=$(mktemp -d)
export PATH=/usr/local/cuda/bin:$PATH
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export PYTHONUNBUFFERED=1 PYAR_REQUIRE_GPU=1 PYAR_RESULTS=$OUT/results.jsonl
export PYAR_SCENARIO_LOG=$OUT/scenarios.log
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
# The hierarchical device data path's tests run under a CUDA-aware Open MPI
# when one is unpacked there (they skip without it); PYAR_SUITE_MPI_TARBALL
# names the PREFIX.tar.gz of scripts/cuda_aware_openmpi.sh /opt/pyar-ompi-cuda
# to unpack first (the GPU machine has no network to build one).
if [ -n "${PYAR_SUITE_MPI_TARBALL:-}" ] && [ ! -x /opt/pyar-ompi-cuda/bin/mpirun ]; then
  tar -C /opt -xzf "$PYAR_SUITE_MPI_TARBALL" || { echo "cannot unpack $PYAR_SUITE_MPI_TARBALL"; exit 1; }
fi
if [ -z "${PYAR_TEST_CUDA_AWARE_MPI:-}" ] && [ -x /opt/pyar-ompi-cuda/bin/mpirun ]; then
  export PYAR_TEST_CUDA_AWARE_MPI=/opt/pyar-ompi-cuda
fi
rm -f "$OUT/results.jsonl" "$OUT/scenarios.log" "$OUT/examples.tsv"

echo "== build"
start=$(date +%s)
if [ "${PYAR_SUITE_PREBUILT_KERNELS:-0}" = 1 ]; then
  # The code objects came with the tree (pyar/_kernels/*.fatbin, built elsewhere
  # with the same nvcc): build the Cython extensions in place, no kernels.
  # The examples run as scripts from examples/, so the tree goes on the path.
  built="extensions in place, prebuilt kernels"
  $PYTHON setup.py build_ext --inplace -j "$(nproc)" >"$OUT/build.log" 2>&1
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
else
  built="pip install -e ., kernels included"
  $PYTHON -m pip install --no-build-isolation --no-deps -e . >"$OUT/build.log" 2>&1
fi
build_status=$?
build_seconds=$(( $(date +%s) - start ))
echo "build: exit $build_status in ${build_seconds}s" | tee -a "$OUT/build.log"
[ $build_status -eq 0 ] || { tail -50 "$OUT/build.log"; exit 1; }

GPUS=$($PYTHON -c 'import pyar; print(pyar.get_device_count())' </dev/null)
echo "visible GPUs: $GPUS"
default_kinds="launch allreduce fused nodes"
[ "${GPUS:-1}" -gt 1 ] && default_kinds="$default_kinds versus"
BENCH_KINDS=${PYAR_SUITE_BENCH_KINDS:-$default_kinds}

stop_mps() { [ "$MPS" = 1 ] && echo quit | nvidia-cuda-mps-control >/dev/null 2>&1; }
if [ "$MPS" = 1 ]; then
  echo "== MPS"
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d && echo "MPS started"
  trap stop_mps EXIT
fi

echo "== tests ($TESTS)"
timeout -k 10 "$TEST_SECONDS" $PYTHON -m pytest -q -rfEs -m gpu --junitxml="$OUT/junit.xml" \
  ${PYAR_SUITE_K:+-k "$PYAR_SUITE_K"} $TESTS 2>&1 | tee "$OUT/pytest.log"
test_status=${PIPESTATUS[0]}

EXAMPLE_RANKS=${PYAR_SUITE_EXAMPLE_RANKS:-4}
if [ "${PYAR_SUITE_EXAMPLES:-1}" = 1 ]; then
  echo "== examples"
  printf 'command\texit\tseconds\n' >"$OUT/examples.tsv"
  : >"$OUT/examples.log"
  run_example() {
    local began status
    began=$(date +%s)
    echo "\$ $*" | tee -a "$OUT/examples.log"
    timeout -k 5 300 "$@" 2>&1 | tee -a "$OUT/examples.log"
    status=${PIPESTATUS[0]}
    printf '%s\t%s\t%s\n' "$*" "$status" "$(( $(date +%s) - began ))" >>"$OUT/examples.tsv"
  }
  run_example $PYTHON -m pyar
  run_example $PYTHON examples/device_info.py
  for example in allreduce.py conjugate_gradient.py interop.py; do
    run_example mpirun -n "$EXAMPLE_RANKS" --oversubscribe --bind-to none \
      $PYTHON "examples/$example"
  done
  for example in allreduce.py conjugate_gradient.py; do  # unchanged, across two nodes
    run_example mpirun -n 4 --oversubscribe --bind-to none -x PYAR_RANKS_PER_NODE=2 \
      $PYTHON "examples/$example"
  done
fi

wants() { [[ " $BENCH_KINDS " == *" $1 "* ]]; }
if [ "$BENCH" = 1 ] && wants launch; then
  echo "== launch overhead"
  timeout -k 5 "$BENCH_SECONDS" $PYTHON benchmarks/launch_overhead.py --json "$OUT/launch.json" \
    2>&1 | tee "$work/launch.txt"
  for w in 1 $BENCH_WORLDS; do
    echo "== whole eager calls, $w rank(s) on one GPU"
    timeout -k 5 "$BENCH_SECONDS" mpirun -n "$w" --oversubscribe --bind-to none \
      $PYTHON benchmarks/launch_overhead.py --collectives --json "$OUT/launch_calls_w$w.json" \
      2>&1 | tee "$work/launch_calls_w$w.txt"
  done
fi
if [ "$BENCH" = 1 ] && wants allreduce; then
  for w in $BENCH_WORLDS; do
    echo "== pyar.bench, $w ranks on one GPU"
    timeout -k 5 "$BENCH_SECONDS" mpirun -n "$w" --oversubscribe --bind-to none \
      $PYTHON -m pyar.bench --no-progress --staged --graph ${PYAR_SUITE_BENCH_ARGS:-} \
      --json "$work/bench_w$w.json" --plot "$work/bench_w$w.png" 2>&1 | tee "$work/bench_w$w.txt"
  done
  cp "$work"/bench_w8.png "$OUT/" 2>/dev/null
fi
if [ "$BENCH" = 1 ] && wants fused; then
  for w in $BENCH_WORLDS; do
    echo "== pyar.bench --fused, $w ranks on one GPU"
    timeout -k 5 "$BENCH_SECONDS" mpirun -n "$w" --oversubscribe --bind-to none \
      $PYTHON -m pyar.bench --fused --no-progress ${PYAR_SUITE_FUSED_ARGS:-} \
      --json "$work/fused_w$w.json" 2>&1 | tee "$work/fused_w$w.txt"
  done
fi
if [ "$BENCH" = 1 ] && wants nodes; then
  for shape in ${PYAR_SUITE_NODE_SHAPES:-8:4 8:2}; do
    w=${shape%%:*} k=${shape##*:}
    echo "== pyar.bench --node-size $k, $w ranks on one GPU ($(( w / k )) simulated nodes)"
    timeout -k 5 "$BENCH_SECONDS" mpirun -n "$w" --oversubscribe --bind-to none \
      $PYTHON -m pyar.bench --no-progress --node-size "$k" -b 4K -e 256M \
      ${PYAR_SUITE_BENCH_ARGS:-} --json "$work/nodes_w${w}x$k.json" \
      --plot "$work/nodes_w${w}x$k.png" 2>&1 | tee "$work/nodes_w${w}x$k.txt"
  done
  cp "$work"/nodes_w*.png "$OUT/" 2>/dev/null
fi
if [ "$BENCH" = 1 ] && wants versus; then
  stop_mps  # NCCL and symmetric memory run without MPS: one process per GPU
  for w in $BENCH_WORLDS; do
    [ "$w" -le "${GPUS:-1}" ] || { echo "== versus_torch: $w ranks need $w GPUs, skipped"; continue; }
    echo "== benchmarks/versus_torch.py, $w ranks, a GPU each"
    timeout -k 5 "$BENCH_SECONDS" mpirun -n "$w" --bind-to none \
      $PYTHON benchmarks/versus_torch.py --json "$work/versus_w$w.json" \
      --plot "$work/versus_w$w.png" 2>&1 | tee "$work/versus_w$w.txt"
  done
fi
cp "$work"/bench_w*.json "$work"/fused_w*.json "$work"/nodes_w*.json "$work"/versus_w*.json "$work"/versus_w*.png \
  "$OUT/" 2>/dev/null

stop_mps
trap - EXIT
$PYTHON scripts/gpu_summary.py --out "$OUT" --bench-dir "$work" --build-seconds "$build_seconds" \
  --built "$built" \
  --test-status "$test_status" | tee "$OUT/summary.md"
if [ -f "$OUT/examples.tsv" ] && awk -F'\t' 'NR > 1 && $2 != 0 { bad = 1 } END { exit !bad }' \
    "$OUT/examples.tsv"; then
  echo "an example failed (see examples.tsv)"
  [ "$test_status" -ne 0 ] || test_status=1
fi
exit "$test_status"
