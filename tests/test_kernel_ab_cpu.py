"""benchmarks/kernel_ab.py without a GPU: its case and build arguments, what it
refuses, and its build of this tree's kernels (with nvcc)."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from benchmarks import kernel_ab

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_allreduce_cases_one_per_size():
    cases = kernel_ab.parse_allreduce("ll:float32:1K,64K")
    assert cases == [("allreduce", "ll", np.dtype(np.float32), 1024),
                     ("allreduce", "ll", np.dtype(np.float32), 65536)]


def test_fused_cases_one_per_token_count_and_quantization():
    cases = kernel_ab.parse_fused("lamport:bfloat16:7168:1,4:none,mxfp4")
    assert [(c[3], c[4], c[5]) for c in cases] == [
        (7168, 1, "none"), (7168, 1, "mxfp4"), (7168, 4, "none"), (7168, 4, "mxfp4")]
    assert str(cases[0][2]) == "bfloat16"
    assert [c[5] for c in kernel_ab.parse_fused("onestage:float16:4096:8")] == ["none"]


@pytest.mark.parametrize("spec, problem", [
    ("ll:bfloat16", "expected ALGO:DTYPE:SIZES"),
    ("fast:bfloat16:1K", "unknown algo 'fast'"),
    ("ll:int8:1K", "dtype must be float32, float16 or bfloat16"),
])
def test_bad_allreduce_cases_are_named(spec, problem):
    with pytest.raises(ValueError, match=problem):
        kernel_ab.parse_allreduce(spec)


@pytest.mark.parametrize("spec, problem", [
    ("lamport:bfloat16:4096", "expected VARIANT:DTYPE:HIDDEN:TOKENS"),
    ("ll:bfloat16:4096:1", "unknown variant 'll'"),
    ("lamport:bfloat16:4096:1:fp4", "unknown quantization \\['fp4'\\]"),
])
def test_bad_fused_cases_are_named(spec, problem):
    with pytest.raises(ValueError, match=problem):
        kernel_ab.parse_fused(spec)


def _build_folder(path, objects=kernel_ab.CODE_OBJECTS):
    path.mkdir()
    for name in objects:
        (path / (name + ".fatbin")).write_bytes(b"\0")
    return str(path)


def test_builds_need_every_code_object_and_two_names(tmp_path):
    full = _build_folder(tmp_path / "full")
    part = _build_folder(tmp_path / "part", ("allreduce", "shards"))
    assert kernel_ab.parse_builds([f"a={full}", f"b={full}"]) == {"a": full, "b": full}
    with pytest.raises(ValueError, match=r"lacks \['allreduce_rmsnorm'\]"):
        kernel_ab.parse_builds([f"a={full}", f"b={part}"])
    with pytest.raises(ValueError, match="each name once"):
        kernel_ab.parse_builds([f"a={full}", f"a={full}"])
    with pytest.raises(ValueError, match="at least two builds"):
        kernel_ab.parse_builds([f"a={full}"])


def test_the_command_line_refuses_a_bad_case_before_any_mpi(tmp_path):
    full = _build_folder(tmp_path / "full")
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "kernel_ab.py"),
                          f"a={full}", f"b={full}", "--fused", "lamport:bfloat16:4096"],
                         capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 2
    assert "expected VARIANT:DTYPE:HIDDEN:TOKENS" in run.stderr


@pytest.mark.skipif(shutil.which("nvcc") is None and not os.path.exists("/usr/local/cuda/bin/nvcc"),
                    reason="needs nvcc to build the kernels")
def test_build_makes_every_code_object_the_runs_load(tmp_path):
    env = dict(os.environ, PATH="/usr/local/cuda/bin:" + os.environ.get("PATH", ""))
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "kernel_ab.py"),
                          "--build", str(tmp_path), "--define", "PYAR_TEST_NO_IDLE_FILL=1"],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=1800)
    assert run.returncode == 0, run.stderr
    assert kernel_ab.parse_builds([f"a={tmp_path}", f"b={tmp_path}"])
