"""Pins cortiq's public names and the behaviour of its process-wide settings."""
import os
import subprocess
import sys

import pytest

import cortiq
from cortiq.kernels import _kernels

# Subprocesses start where the imported cortiq lives, so `-c`/`-m` (which put the
# working directory first on sys.path) cannot pick up an unbuilt source tree.
PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(cortiq.__file__)))

PUBLIC = {
    "ConfigError", "CortiqError", "FormatError", "KernelError", "LLM", "ModelError",
    "SamplingParams", "TemplateError",
    "__version__", "config", "get_int8_activations", "get_num_threads", "get_precision",
    "set_int8_activations", "set_num_threads", "set_precision", "show_config",
}


def test_public_names_are_pinned():
    assert set(cortiq.__all__) == PUBLIC
    for name in PUBLIC:
        assert hasattr(cortiq, name), name


def test_error_hierarchy():
    for e in (cortiq.FormatError, cortiq.KernelError, cortiq.ConfigError, cortiq.TemplateError,
              cortiq.ModelError):
        assert issubclass(e, cortiq.CortiqError)
    assert issubclass(cortiq.ConfigError, ValueError)


def test_show_config_reports_isa_threads_and_build(capsys):
    cortiq.show_config()
    out = capsys.readouterr().out
    c = cortiq.config()
    assert c["isa"] in out and f"threads:      {c['threads']}" in out
    assert c["version"] == cortiq.__version__ and "compiler" in out
    word = {"auto": "auto", True: "on", False: "off"}[c["preload"]]
    assert f"preload:      {word}" in out
    assert c["isa"] in c["isa_usable"] and set(c["isa_usable"]) <= set(c["isa_compiled"])
    if not os.environ.get("CORTIQ_ISA"):
        assert c["isa"] == _kernels.best_isa()
        if {"avx2", "fma", "f16c", "os-ymm"} <= set(c["cpu_features"]):
            assert c["isa"] in ("avx2", "avx512"), "an AVX2 machine must dispatch to AVX2"
    # the wide-row kernels size their x chunks by it: CPUID's answer, clamped, or 32 KiB
    assert 16384 <= c["l1d_bytes"] <= 262144 and c["l1d_bytes"] % 1024 == 0
    assert f"L1 data:      {c['l1d_bytes'] // 1024} KiB" in out


def test_set_num_threads_validates():
    before = cortiq.get_num_threads()
    try:
        cortiq.set_num_threads(3)
        assert cortiq.get_num_threads() == 3 == cortiq.config()["pool"]["threads"]
        for bad in (0, -1, 1.5, "2", True):
            with pytest.raises(cortiq.ConfigError):
                cortiq.set_num_threads(bad)
    finally:
        cortiq.set_num_threads(before)


def _run(env_extra, code="import cortiq; print(cortiq.config()['isa'], cortiq.get_num_threads())"):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORTIQ_")}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120, cwd=PKG_PARENT, check=False)


def test_cortiq_isa_forces_a_table():
    for isa in _kernels.usable_isas():
        r = _run({"CORTIQ_ISA": isa})
        assert r.returncode == 0, r.stderr
        assert r.stdout.split()[0] == isa


def test_cortiq_isa_that_cannot_run_names_the_choices():
    r = _run({"CORTIQ_ISA": "sse9"})
    assert r.returncode != 0
    assert "ConfigError" in r.stderr and "CORTIQ_ISA='sse9'" in r.stderr
    assert "valid choices: ref" in r.stderr
    if "avx512" not in _kernels.usable_isas():
        r = _run({"CORTIQ_ISA": "avx512"})
        assert r.returncode != 0 and "valid choices" in r.stderr


def test_cortiq_num_threads():
    r = _run({"CORTIQ_NUM_THREADS": "3"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[1] == "3"
    r = _run({"CORTIQ_NUM_THREADS": "zero"})
    assert r.returncode != 0 and "CORTIQ_NUM_THREADS" in r.stderr


def test_cortiq_preload():
    code = "import cortiq; print(cortiq.config()['preload'])"
    for value, want in (("", "auto"), ("1", "True"), ("0", "False"), ("true", "True"),
                        ("False", "False"), (" YES ", "True"), ("no", "False"),
                        ("On", "True"), ("off", "False")):
        r = _run({"CORTIQ_PRELOAD": value}, code)
        assert r.returncode == 0 and r.stdout.strip() == want, (value, r.stderr)
    assert _run({}, code).stdout.strip() == "auto"
    r = _run({"CORTIQ_PRELOAD": "1"}, "import cortiq; print(cortiq.LLM().file.preload)")  # demo
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stderr
    assert "preload:      on" in _run({"CORTIQ_PRELOAD": "1"}, "import cortiq; "
                                      "cortiq.show_config()").stdout
    for bad in ("2", "maybe", "y"):
        r = _run({"CORTIQ_PRELOAD": bad})
        assert r.returncode != 0 and "ConfigError" in r.stderr, r.stderr
        assert f"CORTIQ_PRELOAD must be one of 1/0/true/false/yes/no/on/off, got '{bad}'" \
            in r.stderr


def test_cli_version_and_config():
    r = subprocess.run([sys.executable, "-m", "cortiq", "--version"], capture_output=True,
                       text=True, timeout=120, cwd=PKG_PARENT, check=False)
    assert r.returncode == 0 and cortiq.__version__ in r.stdout
    r = subprocess.run([sys.executable, "-m", "cortiq", "config"], capture_output=True,
                       text=True, timeout=120, cwd=PKG_PARENT, check=False)
    assert r.returncode == 0 and "isa:" in r.stdout
