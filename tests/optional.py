"""Optional test groups: what a test needs beyond cortiq, whether a run may skip it, and
what a run covered.

A group is a set of modules or facilities some tests need (an independent reference
such as transformers, a GPU adapter, an emulator). Where a group is missing its tests
skip, unless ``CORTIQ_REQUIRE_<GROUP>=1`` (or ``CORTIQ_REQUIRE_ALL=1``) is set: then
the missing group is a test failure, so a CI job that installed the references cannot
pass without running them. ``.ci/run`` and the wheel workflow's parity jobs set the
flags; a plain ``pytest`` on a workstation skips and says why.

Every call records what happened; ``conftest.pytest_terminal_summary`` prints one line
with the kernel tables the run covered and each group's outcome.
"""
from __future__ import annotations

import importlib
import os
from collections import defaultdict
from types import ModuleType

import pytest

#: group -> (what it is, how to get it)
GROUPS = {
    "torch": ("torch + transformers, the parity references",
              "pip install -r .ci/test-requirements.txt"),
    "ray": ("ray[serve], the Ray Serve tests' cluster", "pip install 'ray[serve]'"),
    "gpu": ("a WebGPU adapter through wgpu (llvmpipe will do)",
            "pip install 'cortiq[gpu]' and a Vulkan/Metal/DX12 driver (mesa-vulkan-drivers)"),
    "arm64": ("an AArch64 compiler and runner for the NEON kernels",
              "apt-get install gcc-aarch64-linux-gnu qemu-user, or an Arm host"),
    "extras": ("the [test] extra's front ends (serve, structured, gguf, clients)",
               "pip install '.[test]'"),
    "isa": ("a CPU feature a kernel table or integer path needs", "a CPU that has it"),
    "llamacpp": ("llama-cpp-python, llama.cpp's own quantizer for the GGUF parity tests",
                 "build llama-cpp-python from source (docs/PERFORMANCE.md §7.4)"),
    "source": ("the source tree next to the tests (csrc/, tools/, benchmarks/)",
               "run the tests from a checkout"),
}

#: group -> set of notes for what ran (e.g. the adapter's name)
RAN: defaultdict[str, set[str]] = defaultdict(set)
#: group -> set of reasons it was skipped
SKIPPED: defaultdict[str, set[str]] = defaultdict(set)


def required(group: str) -> bool:
    """Whether this run must not skip `group` (CORTIQ_REQUIRE_<GROUP> or _ALL)."""
    if group not in GROUPS:
        raise KeyError(f"unknown test group {group!r} (known: {', '.join(GROUPS)})")
    flag = os.environ.get(f"CORTIQ_REQUIRE_{group.upper()}", "")
    return flag == "1" or os.environ.get("CORTIQ_REQUIRE_ALL", "") == "1"


def missing(group: str, why: str) -> None:
    """`group` cannot run here: skip the test (or module), or fail when it is required.
    Never returns."""
    if required(group):
        pytest.fail(f"CORTIQ_REQUIRE_{group.upper()}=1 but {why} ({GROUPS[group][1]})",
                    pytrace=False)
    SKIPPED[group].add(why)
    pytest.skip(f"{group}: {why}", allow_module_level=True)


def need(group: str, *modules: str) -> ModuleType | tuple[ModuleType, ...]:
    """Import `modules` for a test of `group`; a missing one skips or fails (see
    `missing`). Returns the module, or a tuple of them when several are named."""
    got = []
    for name in modules:
        try:
            got.append(importlib.import_module(name))
        except ImportError as e:
            missing(group, f"{name} is not importable ({e})")
    ran(group)
    return got[0] if len(got) == 1 else tuple(got)


def need_that(group: str, ok: bool, why: str) -> None:
    """A condition a test of `group` needs (a class in a library, a CPU feature): skip or
    fail with `why` when it does not hold."""
    if not ok:
        missing(group, why)
    ran(group)


def ran(group: str, note: str = "") -> None:
    """Record that tests of `group` ran (with an optional note: an adapter, an ISA)."""
    RAN[group].add(note)


def summary(tables: list[str], forced: str | None) -> str:
    """One line: the kernel tables the run covered and each group's outcome."""
    cover = f"kernel tables {', '.join(tables)}" + (f" (forced by CORTIQ_ISA={forced})"
                                                    if forced else "")
    parts = []
    for group in GROUPS:
        notes = sorted(n for n in RAN.get(group, ()) if n)
        why = sorted(SKIPPED.get(group, ()))
        if group in RAN:
            state = "ran" + (f" ({'; '.join(notes)})" if notes else "")
            if why:
                state += f", some skipped: {'; '.join(why)}"
        elif why:
            state = f"skipped: {'; '.join(why)}"
        else:
            continue
        parts.append(f"{group} {state}")
    return f"cortiq coverage: {cover}; " + ("; ".join(parts) if parts else "no optional group")


def int8_prompt_products(isa: str | None = None, dtype: str = "q8_row") -> bool:
    """Whether kernel table `isa` (default: the active one) multiplies a prompt chunk's
    matmat of `dtype` with int8 activations on this CPU (the extension's own rule,
    _kernels.prompt_int8_dtypes: the x86 tables take the float32 matmat for the CMF
    dtypes where the CPU has no vpdpbusd)."""
    from cortiq.kernels import _kernels
    return dtype in _kernels.prompt_int8_dtypes(isa)
