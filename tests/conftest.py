"""Every test sees 8 emulated CPU devices (multi-device code is tested this way) and shares
one persistent JAX compilation cache, parallel workers and subprocesses included: the
same tiny models compile in many tests. Tests marked `slow` (the notebooks, long
end-to-end runs) are skipped unless `-m slow` or `--run-slow` asks for them; CI runs both.
pyproject.toml's addopts spread the files over pytest-xdist workers (`-n0`: one process).

The platform is pinned to CPU (on a GPU host too: the suite counts 8 emulated devices)
and matmuls to full float32 precision (a TF32 or bfloat16 default would move the fidelity
comparisons), in this process and, through the environment, in every subprocess.
Under `CI=true` a test skipped for a missing test dependency (`pytest.importorskip`, or a
reason starting with helpers.MISSING) fails instead: CI cannot pass with them skipped."""

import os
import sys
import tempfile

import pytest

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["JAX_DEFAULT_MATMUL_PRECISION"] = "highest"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "vit_jax_tests_jax_cache")
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # tests/helpers.py

import jax  # noqa: E402  (after the environment above)
from helpers import MISSING  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")  # as the environment says

DEPENDENCY_SKIPS = ("could not import", MISSING)  # pytest.importorskip's reason, ours


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", help="also run tests marked slow")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long end-to-end tests (CI runs them: -m slow)")
    config.addinivalue_line("markers", "long: slow tests of 2-8 minutes that CI leaves out "
                            "(-m 'slow and long' runs them)")  # fmt: skip


def pytest_collection_modifyitems(config, items):
    if config.getoption("--run-slow") or "slow" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="slow: run with -m slow or --run-slow (CI does)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def _fail_dependency_skip(report) -> None:
    """Under CI=true, a skip for a missing test dependency becomes a failure."""
    if os.environ.get("CI", "").lower() not in ("1", "true") or not report.skipped:
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    reason = reason.removeprefix("Skipped: ")
    if reason.startswith(DEPENDENCY_SKIPS):
        report.outcome = "failed"
        report.longrepr = f"CI=true: a test dependency is missing ({reason}); run ./setup.sh"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_dependency_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield  # a module-level importorskip skips the whole file at collection
    _fail_dependency_skip(outcome.get_result())
