"""The AArch64 tables (neon, neon_dotprod) against the reference, kernel by kernel.

tests/arm64/run.sh cross-compiles csrc/ with tests/arm64/kernel_check.c and runs it under
qemu-aarch64 (twice: a CPU with the dot product extension and a Cortex-A53 without it),
or natively on an arm64 machine. It is skipped where the cross compiler or qemu is
missing, unless CORTIQ_REQUIRE_ARM64=1 (set by .ci/run after installing them).
"""
import os
import platform
import shutil
import subprocess
from pathlib import Path

import pytest

import optional
ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "arm64" / "run.sh"
NATIVE = platform.machine().lower() in ("aarch64", "arm64")


def _missing():
    if not (ROOT / "csrc" / "cortiq.h").exists():
        return "the C sources (csrc/) are not next to the tests"
    if shutil.which("bash") is None:
        return "no bash"
    if NATIVE:
        return None if shutil.which(os.environ.get("CC", "cc")) else "no C compiler"
    tools = (os.environ.get("CC", "aarch64-linux-gnu-gcc"), os.environ.get("QEMU", "qemu-aarch64"))
    for tool in tools:
        if shutil.which(tool) is None:
            return f"{tool} not installed (apt-get install gcc-aarch64-linux-gnu qemu-user)"
    return None


def test_arm64_kernels_match_reference(tmp_path):
    why = _missing()
    optional.need_that("arm64", why is None, str(why))
    optional.ran("arm64", "native" if NATIVE else "qemu")
    env = dict(os.environ, BUILD=str(tmp_path))
    r = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True,
                       timeout=900, check=False)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    # every table the CPU offers was covered and passed
    assert out.count("OK:") == (1 if NATIVE else 2), out[-6000:]


def test_tables_compiled_for_this_machine():
    """The build compiles the ISA files of its target only, and import picks the best."""
    from cortiq.kernels import _kernels as K

    compiled = K.compiled_isas()
    assert compiled[0] == "ref"
    if NATIVE:
        assert "neon" in compiled and "neon_dotprod" in compiled
        assert not {"avx2", "avx512"} & set(compiled)
        assert "asimd" in K.cpu_features()
        best = "neon_dotprod" if "asimddp" in K.cpu_features() else "neon"
        assert K.best_isa() == best
        assert set(K.usable_isas()) >= {"ref", best}
    else:
        assert not {"neon", "neon_dotprod"} & set(compiled)
        assert not {"asimd", "asimddp"} & set(K.cpu_features())
        with pytest.raises(ValueError, match="not available here"):
            K.set_isa("neon")
