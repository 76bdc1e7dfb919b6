"""Shared fixtures: every compiled ISA that this machine can run, thread counts, the GPU
device; the hypothesis profile; the run's coverage line (tests/optional.py)."""
import os
import sys

import pytest
from hypothesis import HealthCheck, settings

import cortiq
from cortiq.kernels import _kernels

# Helper modules beside the tests (arrays.py, toy_model.py) import by name under
# --import-mode=importlib.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import optional

# CORTIQ_HYPOTHESIS_PROFILE picks the profile (.ci/run sets "ci"); "dev" otherwise.
settings.register_profile(
    "ci", deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, max_examples=25)
settings.load_profile(os.environ.get("CORTIQ_HYPOTHESIS_PROFILE", "dev"))


def _isas():
    forced = os.environ.get("CORTIQ_ISA")
    # Under CORTIQ_ISA the suite exercises only the forced table (the second CI pass).
    return [forced] if forced else _kernels.usable_isas()


@pytest.fixture(scope="session")
def isas():
    """The ISA names to loop over inside hypothesis tests (which cannot take `isa`)."""
    return _isas()


@pytest.fixture(params=_isas())
def isa(request):
    """Activate one kernel table for the test, then restore the previous one."""
    before = _kernels.active_isa()
    _kernels.set_isa(request.param)
    yield request.param
    _kernels.set_isa(before)


@pytest.fixture(params=[1, 2, 3])
def threads(request):
    before = cortiq.get_num_threads()
    cortiq.set_num_threads(request.param)
    yield request.param
    cortiq.set_num_threads(before)


@pytest.fixture(scope="session")
def dev():
    """The GPU device (tests marked gpu): any adapter wgpu offers, llvmpipe included;
    none skips, or fails under CORTIQ_REQUIRE_GPU=1."""
    from cortiq.errors import ConfigError
    optional.need("gpu", "wgpu")
    try:
        from cortiq.gpu import Device
        device = Device.get()
    except ConfigError as e:
        optional.missing("gpu", f"no GPU adapter: {e}")
    optional.ran("gpu", _adapter_name(device))
    return device


def _adapter_name(device) -> str:
    info = getattr(getattr(device, "adapter", None), "info", None) or {}
    return str(info.get("device") or info.get("description") or "adapter")


def pytest_terminal_summary(terminalreporter):
    forced = os.environ.get("CORTIQ_ISA") or None
    terminalreporter.write_line(optional.summary(_isas(), forced))
    features = ", ".join(cortiq.config()["cpu_features"])
    terminalreporter.write_line(f"cortiq coverage: cpu features {features}")


def pytest_report_header(config):
    c = cortiq.config()
    return (f"cortiq {c['version']} from {os.path.dirname(cortiq.__file__)}; isa {c['isa']} "
            f"(usable {', '.join(c['isa_usable'])}), threads {c['threads']}, "
            f"pool spin {c['pool']['spin_us']} us")
