"""The package's kernel build, as the tests (and benchmarks/signature_cost.py) share it:
build_kernels.build of src/kernels, or of another commit's kernel sources, for the given
targets, through the kernel cache, so the tests reuse what the install compiled instead of
compiling again."""
import os
import subprocess
import sys
import tarfile
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from kernel_build import build_kernels  # noqa: E402

KERNELS = os.path.join(ROOT, "src", "kernels")


def build(folder, archs, defines=(), names=None, source=KERNELS):
    """{file name: path} of the code objects built into ``folder`` from the kernel
    sources in ``source`` (src/kernels of this tree, or of another commit's)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYAR_GPU_ARCHS", ";".join(archs))
        made = build_kernels.build(source, str(folder), defines, names)
    return {os.path.basename(path): path for path in made}


def build_commit(folder, archs, defines, names, commit):
    """build() of the kernel sources of ``commit`` (read with git archive)."""
    with tempfile.TemporaryDirectory() as tree:
        archive = os.path.join(tree, "src.tar")
        subprocess.run(["git", "-C", ROOT, "archive", "-o", archive, commit, "src/kernels"],
                       check=True)
        with tarfile.open(archive) as tar:
            tar.extractall(tree, filter="data")
        return build(folder, archs, defines, names, source=os.path.join(tree, "src", "kernels"))
