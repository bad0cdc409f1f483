"""The commands as a user first meets them, run as subprocesses: `--help` lists each
command's own flags (the shared model flags of cli.define_model_flags included, absl's and
JAX's left to --helpfull), and a mistake in the flags is one `error:` line with the way out."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import ROOT, defined_flags

COMMANDS = {  # python -m NAME -> the module that defines its flags
    "vit_jax.main": "vit_jax.main",
    "vit_jax.recipe": "vit_jax.recipe",
    "vit_jax.infer": "vit_jax.infer",
    "vit_jax.fewshot": "vit_jax.fewshot",
    "vit_jax.figures": "vit_jax.figures",
    "vit_jax.convert": "vit_jax.convert",
    "vit_jax.checkpoints": "vit_jax.checkpoints",
    "vit_jax.evaluate": "vit_jax.evaluate",
    "vit_jax.plan": "vit_jax.plan",
}
MODEL_FLAGS = {"checkpoint", "model", "override", "image_size", "patch_size"}
MISTAKES = {  # name -> (command, its arguments)
    "preset": ("vit_jax.main", ["--config=fashion_mnist:tny", "--workdir=unused"]),
    "unknown": ("vit_jax.infer", ["--chekpoint=x.npz", "--image=x.png"]),
    "required": ("vit_jax.evaluate", []),
    "value": ("vit_jax.convert", ["--checkpoint=x.npz", "--format=png", "--out=y"]),
    "missing": ("vit_jax.infer", ["--checkpoint=x.npz", "--image=nowhere.png"]),
}
DEBUG = {"missing_debug": MISTAKES["missing"]}  # the same mistake with VIT_JAX_DEBUG=1


@pytest.fixture(scope="module")
def runs():
    """Every command's --help and every mistake, started at once (each imports jax)."""
    env = {k: v for k, v in os.environ.items() if k != "VIT_JAX_DEBUG"}
    jobs = {name: (name, ["--help"]) for name in COMMANDS} | MISTAKES | DEBUG
    procs = {
        key: subprocess.Popen(
            [sys.executable, "-m", command, *args],
            cwd=ROOT,
            env=dict(env, VIT_JAX_DEBUG="1") if key in DEBUG else env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for key, (command, args) in jobs.items()
    }
    out = {}
    for key, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        out[key] = (proc.returncode, stdout, stderr)
    return out


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_lists_the_commands_own_flags(runs, command):
    code, stdout, stderr = runs[command]
    assert code == 0, stderr[-2000:]
    listed = set(re.findall(r"^  --(?:\[no\])?(\w+)", stdout, re.MULTILINE))
    expected = defined_flags(COMMANDS[command])
    assert expected and listed == expected, (sorted(listed), sorted(expected))
    if command in ("vit_jax.infer", "vit_jax.fewshot", "vit_jax.figures", "vit_jax.convert",
                   "vit_jax.evaluate"):  # fmt: skip
        assert MODEL_FLAGS <= listed
    assert "--verbosity" not in stdout and "--jax_" not in stdout  # those are in --helpfull
    assert "Try --helpfull" in stdout


def one_error_line(key: str, runs) -> str:
    code, stdout, stderr = runs[key]
    assert code == 1 and stdout == "", (code, stdout, stderr)
    lines = stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: "), stderr
    assert lines[1] == "(for the Python traceback, set VIT_JAX_DEBUG=1)"
    assert "FATAL" not in stderr and "Traceback" not in stderr and "--helpshort" not in stderr
    return lines[0]


def test_a_bad_preset_argument_names_the_valid_ones(runs):
    line = one_error_line("preset", runs)
    valid = "pretrain, finetune, scratch, full, tiny"
    assert line == f"error: --config=fashion_mnist:tny: expected one of {valid}"


def test_main_help_names_the_presets_arguments(runs):
    from vit_jax import configs

    help_text = " ".join(runs["vit_jax.main"][1].split())
    listed = re.search(r"fashion_mnist:([\w|]+),", help_text).group(1).split("|")
    error = one_error_line("preset", runs)  # the valid arguments, as get_config names them
    assert listed == error.split("expected one of ")[1].split(", ")
    for arg in listed:
        assert configs.get(f"fashion_mnist:{arg}").total_steps > 0
    for arg in re.findall(r"e\.g\. (\w+:[\w,]+)\)", help_text):
        assert configs.get(arg).total_steps > 0


def test_absl_flag_errors_name_the_way_out(runs):
    line = one_error_line("unknown", runs)
    assert line.startswith("error: Unknown command line flag 'chekpoint'")
    assert "Did you mean: checkpoint" in line
    assert line.endswith("(python -m vit_jax.infer --help lists the flags)")
    line = one_error_line("required", runs)
    assert (
        line
        == "error: --checkpoint is required (python -m vit_jax.evaluate --help lists the flags)"
    )
    line = one_error_line("value", runs)
    assert line.startswith("error: flag --format=png: value should be one of <npz|timm|")
    assert line.endswith("(python -m vit_jax.convert --help lists the flags)")
    # The command that the lines name is the one test_help_lists_the_commands_own_flags runs.
    for key in ("unknown", "required", "value"):
        command = re.search(r"\(python -m (\S+) --help", runs[key][2]).group(1)
        assert runs[command][0] == 0


def test_vit_jax_debug_shows_the_traceback_of_a_user_error(runs):
    line = one_error_line("missing", runs)
    assert line == "error: image not found: nowhere.png"
    code, stdout, stderr = runs["missing_debug"]
    assert code == 1 and stdout == "", stderr
    lines = stderr.splitlines()
    assert lines[0] == "Traceback (most recent call last):", stderr
    assert any(re.search(r'File ".*/vit_jax/cli\.py", line \d+, in entry', s) for s in lines)
    assert re.fullmatch(r"FileNotFoundError: image not found: nowhere\.png", lines[-1]), stderr
    assert "error: " not in stderr and "VIT_JAX_DEBUG" not in stderr


def readme_test_command() -> str:
    """The README's command that sets up and runs the tests (its top block)."""
    with open(os.path.join(ROOT, "README.md")) as f:
        (line,) = [s.strip() for s in f if s.startswith("./setup.sh && python -m pytest")]
    return line


def test_readme_test_command_is_what_ci_runs():
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        ci = [line.strip() for line in f]
    assert readme_test_command() in ci
    slow = 'python -m pytest -q -m "slow and not long"'  # the slow tests but the long (README)
    assert slow in ci
    with open(os.path.join(ROOT, "README.md")) as f:
        assert f"`{slow}`" in " ".join(f.read().split())


def test_readme_test_command_ends_with_the_summary_line(tmp_path):
    """pytest run with the README's arguments and this project's pyproject.toml (its
    addopts) on a tiny suite prints `1 passed, 1 skipped`."""
    args = readme_test_command().split("python -m pytest", 1)[1].split()
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        (tmp_path / "pyproject.toml").write_text(f.read())
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_tiny.py").write_text(
        "import pytest\n\n\ndef test_passes():\n    assert True\n\n\n"
        "@pytest.mark.skip(reason='tiny')\ndef test_skipped():\n    pass\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"=* ?1 passed, 1 skipped in [\d.]+s ?=*", last), proc.stdout


LATE_NOISE = """
import asyncio, logging, sys, threading, time
from vit_jax import cli

def main():
    # What a failed asynchronous checkpoint write leaves behind: a library's error log
    # from a background thread, a future whose exception nobody retrieved (asyncio logs
    # it when the future is collected, at exit), an error in a finalizer, a coroutine
    # never awaited (Python warns when it is collected, at exit).
    async def write():
        pass

    main.coroutine = write()
    loop = asyncio.new_event_loop()
    main.future = loop.create_future()
    main.future.set_exception(OSError("write failed"))
    threading.Thread(
        target=lambda: (time.sleep(0.3), logging.getLogger("orbax").error("save failed"))
    ).start()

    class Finalizer:
        def __del__(self):
            raise RuntimeError("Event loop is closed")

    main.finalizer = Finalizer()
    raise OSError("could not save checkpoint step 5: No space left on device")

cli.run(main)
"""


@pytest.mark.parametrize("debug", ["", "1"])
def test_after_the_error_line_nothing(debug):
    """A failed run's one line is its last output, whatever libraries report later."""
    env = {**os.environ, "VIT_JAX_DEBUG": debug}
    done = subprocess.run(
        [sys.executable, "-c", LATE_NOISE], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 1 and done.stdout == ""
    if not debug:
        assert done.stderr.splitlines() == [
            "error: could not save checkpoint step 5: No space left on device",
            "(for the Python traceback, set VIT_JAX_DEBUG=1)",
        ]
    else:  # VIT_JAX_DEBUG=1 shows everything: the traceback and what came after
        assert "Traceback" in done.stderr and "save failed" in done.stderr
        assert "coroutine 'main.<locals>.write' was never awaited" in done.stderr


# ---------------------------------------------------------------- the library names no flags


def command_flags() -> set[str]:
    """Every flag a command defines (`flags.DEFINE_*("name", ...)`), cli.py's shared ones too."""
    names = set()
    for path in [*Path(ROOT, "vit_jax").glob("*.py")]:
        names |= set(re.findall(r"DEFINE_\w+\(\s*\"(\w+)\"", path.read_text()))
    return names - {"config"}  # --config=PRESET names a config, which the configs parse


def flags_spoken(path) -> list[str]:
    """`--flag` of a command in the string literals of a module (docstrings aside)."""
    import ast

    tree = ast.parse(path.read_text())
    skip = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }  # fmt: skip
    texts = []  # (line, text): a literal, or an f-string's literal parts as one text
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            parts = [v for v in node.values if isinstance(v, ast.Constant)]
            skip |= {id(v) for v in parts}
            texts.append((node.lineno, "{}".join(v.value for v in parts)))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in skip:
                texts.append((node.lineno, node.value))
    pattern = re.compile(r"--(" + "|".join(sorted(command_flags())) + r")\b")
    return [
        f"{path.name}:{line}: {m[0]}"
        for line, text in texts
        if not text.startswith("tfds build ")  # TFDS's own command line
        for m in pattern.finditer(text)
    ]


def test_the_library_names_arguments_not_flags():
    """A library caller has no flags: the modules under vit_jax/'s folders name arguments and
    config fields; cli.in_flags says them as flags for the commands."""
    library = [p for p in Path(ROOT, "vit_jax").rglob("*.py") if p.parent.name != "vit_jax"]
    assert sorted(s for p in library for s in flags_spoken(p)) == []


def test_a_planted_flag_is_found(tmp_path):
    planted = tmp_path / "m.py"
    planted.write_text('"""Doc --model=X is fine."""\nx = f"pass --model={1} or --numerics"\n')
    assert flags_spoken(planted) == ["m.py:2: --model", "m.py:2: --numerics"]


def test_in_flags_says_the_library_arguments_as_flags():
    from vit_jax import cli
    from vit_jax.weights import timm

    with pytest.raises(timm.CheckpointError) as e:
        timm.from_timm({"patch_embed.proj.weight": np.zeros((100, 3, 4, 4))})
    message = str(e.value)
    assert "(name=NAME) or its heads (num_heads=H)" in message
    assert "(--model=NAME) or its heads (--override=num_heads=H)" in cli.in_flags(message)
