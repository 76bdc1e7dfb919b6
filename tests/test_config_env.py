"""Environment variables: every one is read through cortiq.kernels._config (env / env_values),
under a CORTIQ_ name; the older names in _config.RENAMED still count, with one
DeprecationWarning per name and process that names the new variable."""
import ast
import warnings
from pathlib import Path

import pytest

import cortiq
from cortiq.kernels import _config
from cortiq.errors import ConfigError

SRC = Path(cortiq.__file__).resolve().parent


@pytest.fixture
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(_config, "_warned", set())


def test_new_names_carry_the_prefix_and_old_names_are_distinct():
    assert all(n.startswith("CORTIQ_") for n in _config.RENAMED)
    assert not any(o.startswith("CORTIQ_") for o in _config.RENAMED.values())
    assert len(set(_config.RENAMED.values())) == len(_config.RENAMED)


def test_old_name_warns_once_and_gives_its_value(fresh_warnings):
    env = {"CMF_DORY_KV": "last_loop"}
    with pytest.warns(DeprecationWarning, match="set CORTIQ_DORY_KV instead") as rec:
        assert _config.env("CORTIQ_DORY_KV", env) == "last_loop"
    assert rec[0].filename == __file__     # points at the caller outside the package
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _config.env("CORTIQ_DORY_KV", env) == "last_loop"     # once per process


def test_new_name_reads_without_warning_and_wins(fresh_warnings):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _config.env("CORTIQ_DORY_KV", {"CORTIQ_DORY_KV": "per_loop",
                                              "CMF_DORY_KV": "last_loop"}) == "per_loop"
        assert _config.env("CORTIQ_DORY_KV", {}) is None
        assert _config.env_values(["CORTIQ_DORY_KV", "CORTIQ_DORY_O1"],
                                  {"CORTIQ_DORY_O1": "off"}) == {"CORTIQ_DORY_O1": "off"}


def test_env_reads_the_process_environment(monkeypatch, fresh_warnings):
    monkeypatch.delenv("CORTIQ_DORY_O1_SPILL", raising=False)
    monkeypatch.setenv("CMF_O1_SPILL", "/spill")
    with pytest.warns(DeprecationWarning, match="CMF_O1_SPILL"):
        assert _config.env("CORTIQ_DORY_O1_SPILL") == "/spill"


def test_device_cache_and_gpu_splits_read_their_variables(monkeypatch, tmp_path):
    from cortiq.gpu.device import resolve_device
    from cortiq.pretrained import cache_dir
    monkeypatch.setenv("CORTIQ_DEVICE", "cpu")
    assert resolve_device(None) == "cpu"
    monkeypatch.setenv("CORTIQ_DEVICE", "tpu")
    with pytest.raises(ConfigError, match="tpu"):
        resolve_device(None)
    monkeypatch.setenv("CORTIQ_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path
    monkeypatch.delenv("CORTIQ_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir() == tmp_path / "cortiq"
    pytest.importorskip("wgpu")
    from cortiq.gpu.dory import _attn_splits
    monkeypatch.setenv("CORTIQ_GPU_ATTN_SPLITS", "2")
    assert _attn_splits(None, 4) == 2
    monkeypatch.setenv("CORTIQ_GPU_ATTN_SPLITS", "two")
    with pytest.raises(ConfigError, match="CORTIQ_GPU_ATTN_SPLITS"):
        _attn_splits(None, 4)


def _environment_reads(tree):
    """Lines of `tree` that read the environment (os.environ / os.getenv), other than
    os.environ.setdefault (a default handed to a third-party loader, not a setting)."""
    setdefault = {id(n.value) for n in ast.walk(tree)
                  if isinstance(n, ast.Attribute) and n.attr == "setdefault"}
    return [n.lineno for n in ast.walk(tree)
            if (isinstance(n, ast.Attribute) and n.attr in ("environ", "getenv")
                and id(n) not in setdefault)
            or (isinstance(n, ast.Name) and n.id in ("environ", "getenv"))
            or (isinstance(n, ast.alias) and n.name in ("environ", "getenv"))]


def test_the_checker_finds_environment_reads():
    code = ("import os\nfrom os import getenv\na = os.environ.get('X')\n"
            "b = os.getenv('Y')\nos.environ.setdefault('Z', '1')\n")
    assert sorted(_environment_reads(ast.parse(code))) == [2, 3, 4]


def test_only_config_reads_the_environment():
    found = {}
    for path in SRC.rglob("*.py"):
        if path.name == "_config.py":
            continue
        lines = _environment_reads(ast.parse(path.read_text(), str(path)))
        if lines:
            found[str(path.relative_to(SRC))] = lines
    assert found == {}
