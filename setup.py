"""Builds the native constraint engine (``native/``) as ``serving.constraints._native``.

Everything else about the package is declared in pyproject.toml; this file exists only because
a C++ extension needs a build step. ``CONSTRAINTS_SANITIZE=1`` builds it with AddressSanitizer
and UndefinedBehaviorSanitizer (see native/README.md).
"""

import os
from glob import glob

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension, build_ext
from setuptools import setup

sanitize = os.environ.get("CONSTRAINTS_SANITIZE") == "1"
compile_args = ["-O3", "-Wall", "-Wextra", "-Wno-unknown-pragmas", "-pthread"]
link_args = ["-pthread"]
if sanitize:
    flags = [
        "-fsanitize=address,undefined",
        "-fno-omit-frame-pointer",
        "-fno-sanitize-recover=undefined",
    ]
    # -Werror here: ./dev test builds this in CI, so any warning fails the run.
    compile_args = ["-O1", "-g", "-Wall", "-Wextra", "-Werror", "-pthread", *flags]
    link_args = ["-pthread", *flags]

# One compiler process per source file, as many at once as there are cores (NPY_NUM_BUILD_JOBS
# to choose): the install and the sanitizer build each compile seven files.
ParallelCompile("NPY_NUM_BUILD_JOBS").install()

setup(
    ext_modules=[
        Pybind11Extension(
            "serving.constraints._native",
            sorted(glob("native/src/*.cpp")),
            include_dirs=["native/include"],
            cxx_std=17,
            extra_compile_args=compile_args,
            extra_link_args=link_args,
            depends=sorted(glob("native/include/*.h")),
        )
    ],
    cmdclass={"build_ext": build_ext},
)
