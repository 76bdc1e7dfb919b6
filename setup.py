"""Build of the one extension, cortiq.kernels._kernels.

C sources under csrc/ are compiled here, each with the flags its file name asks for:
  *_avx2.c         -> AVX2 + FMA + F16C        (x86-64 only)
  *_avx512.c       -> AVX-512 F/BW/VL/DQ       (x86-64 only)
  *_neon.c         -> -march=armv8-a           (AArch64 only: the baseline, NEON)
  *_neon_dotprod.c -> -march=armv8.2-a+dotprod (AArch64 only: sdot)
  anything else -> portable baseline flags
The target machine (cross builds: _PYTHON_HOST_PLATFORM) decides which ISA files are
compiled at all; the CPU decides at run time which table runs (csrc/dispatch.c).
and linked with the Cython module. No -march=native unless CORTIQ_NATIVE=1 asks for a
local build. Threads come from cortiq's own pool (csrc/pool.c: pthreads, or Win32
threads on Windows): no OpenMP runtime is needed on any platform.
"""
import glob
import os
import sysconfig

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = "csrc"
NATIVE_FLAG = "-march=native"  # only with CORTIQ_NATIVE=1 (a local build)


def _target_arch() -> str:
    """'x86', 'arm64' or 'other': the machine the extension is built for."""
    plat = sysconfig.get_platform().lower()  # honours cross builds (_PYTHON_HOST_PLATFORM)
    if "universal2" in plat:  # one compiler call for two targets: portable files only
        return "other"
    if any(t in plat for t in ("aarch64", "arm64")):
        return "arm64"
    if any(t in plat for t in ("x86_64", "amd64", "i686", "win32")):
        return "x86"
    machine = os.uname().machine if hasattr(os, "uname") else ""
    if plat.startswith("linux") and machine in ("x86_64", "i686"):
        return "x86"
    if plat.startswith("linux") and machine in ("aarch64", "arm64"):
        return "arm64"
    return "other"


def _c_sources():
    files = sorted(glob.glob(os.path.join(CSRC, "*.c")) + glob.glob(os.path.join(CSRC, "*", "*.c")))
    groups = {"base": [], "avx2": [], "avx512": [], "neon": [], "neon_dotprod": []}
    for f in files:
        stem = os.path.splitext(os.path.basename(f))[0]
        if stem.endswith("_neon_dotprod"):
            groups["neon_dotprod"].append(f)
        elif stem.endswith("_neon"):
            groups["neon"].append(f)
        elif stem.endswith("_avx512"):
            groups["avx512"].append(f)
        elif stem.endswith("_avx2"):
            groups["avx2"].append(f)
        else:
            groups["base"].append(f)
    return groups


class BuildKernels(build_ext):
    """Compiles csrc/ per ISA group, then links the objects into the extension."""

    def build_extension(self, ext):
        msvc = self.compiler.compiler_type == "msvc"
        native = os.environ.get("CORTIQ_NATIVE") == "1"
        if msvc:
            common = ["/O2", "/fp:precise"]
            isa_flags = {"base": [], "avx2": ["/arch:AVX2"], "avx512": ["/arch:AVX512"],
                         "neon": [], "neon_dotprod": []}
            thread_l = []
        else:
            # No contraction of a*b+c into FMA behind our back: the reference kernels
            # must compute exactly what their source says on every platform.
            common = ["-O3", "-std=gnu11", "-ffp-contract=off", "-fno-math-errno",
                      "-fvisibility=hidden", "-Wall", "-Wno-unused-function"]
            isa_flags = {"base": [], "avx2": ["-mavx2", "-mfma", "-mf16c"],
                         "avx512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq",
                                    "-mavx2", "-mfma", "-mf16c"],
                         "neon": ["-march=armv8-a"],
                         "neon_dotprod": ["-march=armv8.2-a+dotprod"]}
            thread_l = ["-pthread"]
            if native:  # a local, non-portable build: never in a wheel
                common.append(NATIVE_FLAG)

        groups = _c_sources()
        macros = list(ext.define_macros)
        arch = _target_arch()
        if arch != "x86":
            groups["avx2"], groups["avx512"] = [], []
        if arch != "arm64" or msvc:  # (MSVC on arm64: the portable tables only)
            groups["neon"], groups["neon_dotprod"] = [], []
        for group in ("avx2", "avx512", "neon", "neon_dotprod"):
            if groups[group]:
                macros.append(("CORTIQ_HAVE_" + group.upper(), "1"))

        objects = []
        for group, sources in groups.items():
            if not sources:
                continue
            objects += self.compiler.compile(
                sources, output_dir=self.build_temp, macros=macros,
                include_dirs=[CSRC], extra_postargs=common + isa_flags[group],
                depends=glob.glob(os.path.join(CSRC, "**", "*.h"), recursive=True),
                debug=self.debug)
        ext.extra_objects = objects + list(ext.extra_objects or [])
        # build_ext relinks only when a source or a dependency is newer than the module;
        # without the objects here, a change to csrc/ alone left the old module in place.
        ext.depends = list(ext.depends or []) + objects
        ext.extra_link_args = list(ext.extra_link_args or []) + thread_l
        ext.extra_compile_args = list(ext.extra_compile_args or []) + (["-O2"] if not msvc else [])
        super().build_extension(ext)


extension = Extension(
    "cortiq.kernels._kernels",
    sources=["src/cortiq/kernels/_kernels.pyx"],
    include_dirs=[CSRC, np.get_include()],
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
)

setup(
    ext_modules=cythonize([extension], compiler_directives={"language_level": "3"},
                          include_path=["src/cortiq/kernels"]),
    cmdclass={"build_ext": BuildKernels},
)
