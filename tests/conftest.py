"""Every test sees 8 emulated CPU devices (multi-device code is tested this way) and shares
one persistent JAX compilation cache, parallel workers and subprocesses included: the
same tiny models compile in many tests. Tests marked `slow` (the notebooks, long
end-to-end runs) are skipped unless `-m slow` or `--run-slow` asks for them; CI runs both.
pyproject.toml's addopts spread the files over pytest-xdist workers (`-n0`: one process)."""

import os
import sys
import tempfile

import pytest

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "vit_jax_tests_jax_cache")
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # tests/helpers.py


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", help="also run tests marked slow")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long end-to-end tests (CI runs them: -m slow)")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--run-slow") or "slow" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="slow: run with -m slow or --run-slow (CI does)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
