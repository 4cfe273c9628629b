"""The type information pyar ships: the stubs of the Cython modules match
what they compile to (mypy's stubtest), and pyar's public surface and the
examples type-check against them (mypy).  A positive control shows the
check fails on a wrong use."""
import os
import subprocess
import sys

import pytest

from tests.mpi_launch import ROOT

pytest.importorskip("mypy", reason="mypy is in the test extra: pip install -e '.[test]'")


def mypy(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "mypy", *args], capture_output=True,
                          text=True, timeout=600, cwd=cwd)


def test_stubs_match_the_compiled_modules():
    done = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "pyar._hip._runtime", "pyar.array._dlpack",
         "--allowlist", os.path.join("tests", "stubtest_allowlist.txt")],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr


def test_pyar_and_the_examples_type_check():
    done = mypy("pyar", "examples")
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_wrong_use_is_caught(tmp_path):
    program = tmp_path / "wrong.py"
    program.write_text("import pyar\n\nname: int = pyar.Device(0).name\n"
                       "pyar.Stream().record(event=3)\n")
    done = mypy("--config-file", os.path.join(ROOT, "pyproject.toml"), str(program))
    assert done.returncode == 1, done.stdout
    assert "Incompatible types in assignment" in done.stdout
    assert '"record" of "Stream" has incompatible type "int"' in done.stdout
