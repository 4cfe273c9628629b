import glob
import os
import sys

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_py import build_py

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_build import build_kernels  # noqa: E402

RUNTIME_SOURCES = ["src/runtime/runtime.c", "src/runtime/hip_loader.c", "src/runtime/cuda_loader.c"]


class build_py_with_kernels(build_py):
    """Also compile src/kernels into pyar/_kernels (in the source tree for
    editable installs, in the build tree otherwise)."""

    def run(self):
        super().run()
        root = "." if self.editable_mode else self.build_lib
        build_kernels.build("src/kernels", os.path.join(root, "pyar", "_kernels"))


extensions = [
    Extension("pyar._hip._runtime", ["pyar/_hip/_runtime.pyx", *RUNTIME_SOURCES],
              include_dirs=["src/runtime"], libraries=["dl", "pthread"],
              depends=glob.glob("src/runtime/*.h") + glob.glob("pyar/_hip/*.pxi")),
    Extension("pyar.array._dlpack", ["pyar/array/_dlpack.pyx"]),
    Extension("pyar.comm._eager", ["pyar/comm/_eager.pyx"]),
]

setup(
    ext_modules=cythonize(extensions, compiler_directives={"language_level": "3"}),
    cmdclass={"build_py": build_py_with_kernels},
)
