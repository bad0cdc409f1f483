"""The suite itself: it runs the same way on any host (CPU-pinned, full-precision matmuls),
plain `pytest` collects every file, and under CI=true a missing test dependency fails the
run instead of skipping it (tests/conftest.py)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import jax
from helpers import ROOT


def test_platform_and_matmul_precision_are_pinned_here_and_in_subprocesses():
    assert jax.default_backend() == "cpu" and jax.device_count() == 8
    assert jax.config.jax_default_matmul_precision == "highest"
    code = "import jax; print(jax.default_backend(), jax.config.jax_default_matmul_precision)"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.stdout.split() == ["cpu", "highest"], done.stderr


def test_plain_pytest_collects_the_studies_tests():
    """The `pytest` script (unlike `python -m pytest`) does not put the checkout on
    sys.path: pyproject's `pythonpath` does, or `import studies` fails at collection."""
    script = shutil.which("pytest", path=os.path.dirname(sys.executable)) or shutil.which("pytest")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
    done = subprocess.run(
        [script, "--collect-only", "-q", "-n0", "-p", "no:cacheprovider", "tests/test_studies.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"^\d+ tests collected", done.stdout, re.M), done.stdout


TESTS = """\
import pytest
from helpers import MISSING


def test_needs_a_module():
    pytest.importorskip("vit_jax_no_such_module")


def test_needs_data():
    pytest.skip(f"{MISSING} some data")


@pytest.mark.skip(reason="not a dependency")
def test_skipped():
    pass
"""


def test_under_ci_a_missing_test_dependency_fails(tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    for name in ("conftest.py", "helpers.py"):
        shutil.copy(os.path.join(ROOT, "tests", name), tests / name)
    (tests / "test_deps.py").write_text(TESTS)
    (tests / "test_module.py").write_text('import pytest\n\npytest.importorskip("no_such")\n')
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS")}
    outcomes = {}
    for ci in ("", "true"):
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-n0"]
            + ["tests", "--rootdir", str(tmp_path), "--continue-on-collection-errors"],
            cwd=tmp_path,
            env={**env, "CI": ci},
            capture_output=True,
            text=True,
            timeout=300,
        )
        outcomes[ci] = (done.returncode, done.stdout.strip().splitlines()[-1])
    assert outcomes[""][0] == 0 and re.fullmatch(r"4 skipped in .*", outcomes[""][1]), outcomes
    assert outcomes["true"][0] == 1, outcomes
    assert re.fullmatch(r"2 failed, 1 skipped, 1 error in .*", outcomes["true"][1]), outcomes
