"""The house: a file at the top of vit_jax/ is a command, each folder one job, and imports
only go down (README, Layout). Every import counts, at the top of a module or inside a
function, as read by `ast` from the source."""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import pytest
from helpers import ROOT

PACKAGE = Path(ROOT) / "vit_jax"

# The rooms, lowest first: a module may import from its own room or one below it.
LAYERS = (
    "base",  # whole-or-nothing writes, quiet TensorFlow, terminal output, short lists
    "models",  # the network and applying it over batches
    "parallel",  # mesh and shardings; multi-host
    "data",  # the input pipelines; image files for the commands
    "weights",  # parameter files people pass around
    "workdir",  # a run's own checkpoints
    "evaluation",  # linear few-shot; top-1/top-5
    "inspection",  # what a model learned: filters, position embeddings, attention
    "configs",  # the presets
    "training",  # state, steps, optimizer, the loop, guards, progress; the recipe
    "cli",  # what the commands share
    "commands",  # main, recipe, infer, evaluate, fewshot, figures, convert, checkpoints, plan
)
COMMANDS = {
    "main",
    "recipe",
    "infer",
    "evaluate",
    "fewshot",
    "figures",
    "convert",
    "checkpoints",
    "plan",
}


def module_names(root: Path) -> dict[str, Path]:
    """'vit_jax.weights.npz' -> its file, for every module of the package at `root`."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = ("vit_jax", *path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports(root: Path) -> dict[str, set[str]]:
    """Module -> the vit_jax modules it imports anywhere in its source (a name imported
    from a package counts as the package unless it is a module of its own)."""
    modules = module_names(root)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    found.add(sub if sub in modules else base)
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def room(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "package"
    if len(parts) == 2 and not (PACKAGE / parts[1]).is_dir():
        return "cli" if parts[1] == "cli" else "commands"
    return parts[1]


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `graph` (its modules in order, the first repeated at the
    end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return path[path.index(n) :] + [n]
            if n not in state and (found := visit(n)):
                return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_no_import_circle():
    assert cycle(imports(PACKAGE)) is None


def test_a_planted_circle_is_found(tmp_path):
    root = tmp_path / "vit_jax"
    shutil.copytree(PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__"))
    files = root / "base" / "files.py"  # base is the lowest room; train imports it
    files.write_text(
        files.read_text() + "\n\ndef _late():\n    from vit_jax.training import train\n"
    )
    found = cycle(imports(root))
    assert found is not None and found[0] == found[-1]
    assert "vit_jax.base.files" in found and "vit_jax.training.train" in found
    assert upward(root) == ["vit_jax.base.files (base) imports vit_jax.training.train (training)"]


def _edges(root: Path) -> list[tuple[str, str]]:
    return [(a, b) for a, targets in imports(root).items() for b in targets]


def upward(root: Path) -> list[str]:
    """Every import of a module from a room above its own."""
    rank = {r: i for i, r in enumerate(LAYERS)}
    return sorted(
        f"{a} ({room(a)}) imports {b} ({room(b)})"
        for a, b in _edges(root)
        if room(a) != "package" and rank[room(b)] > rank[room(a)]
    )


def test_the_readme_draws_the_layers_top_down():
    text = (PACKAGE.parent / "README.md").read_text()
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    drawn = []
    for line in block.splitlines():
        if line.startswith("  main.py"):
            drawn.append("commands")
        elif m := re.match(r"  (\w+)(/|\.py) ", line):
            drawn.append(m[1])
    assert drawn == list(reversed(LAYERS))


def test_each_room_names_its_modules_once():
    """Each folder's __init__.py docstring has a line for each of its modules (a line may
    name two), and names no module that is gone."""
    for room in LAYERS[:-2]:
        init = ast.parse((PACKAGE / room / "__init__.py").read_text())
        doc = ast.get_docstring(init, clean=False) or ""
        named = []
        for line in doc.splitlines():
            if re.match(r"\s+\w+\.py\b", line):
                head = re.split(r"\s{2,}", line.strip())[0]
                named += re.findall(r"\b(\w+)\.py\b", head)
        modules = [p.stem for p in (PACKAGE / room).glob("*.py") if p.name != "__init__.py"]
        assert sorted(named) == sorted(modules), room


def test_rooms_are_the_layers():
    rooms = {room(m) for m in module_names(PACKAGE)} - {"package"}
    assert rooms == set(LAYERS)


def test_imports_only_go_down():
    assert upward(PACKAGE) == []


def test_commands_are_imported_by_nobody():
    commands = {m for m in module_names(PACKAGE) if room(m) == "commands"}
    assert {m.rpartition(".")[2] for m in commands} == COMMANDS
    assert [(a, b) for a, b in _edges(PACKAGE) if b in commands] == []


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_ends_with_cli_run(name):
    tree = ast.parse((PACKAGE / f"{name}.py").read_text())
    last = tree.body[-1]
    assert isinstance(last, ast.If) and ast.unparse(last.test) == "__name__ == '__main__'"
    call = last.body[-1].value
    assert isinstance(call, ast.Call) and ast.unparse(call.func) == "cli.run"


def test_the_top_holds_commands_and_cli_only():
    top = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    assert top == COMMANDS | {"cli"}


def test_no_file_over_350_lines_and_no_function_over_60():
    """The house's limits (STYLE.md): a file or function past them asks to be split along a
    real seam (`python benchmarks/code_lines.py` prints them)."""
    from benchmarks.code_lines import library_files, over_limits

    assert over_limits(library_files(None)) == []


def test_the_package_is_formatted_plainly_overrides_only_on_literal_tables():
    """ruff's layout is the house's (STYLE.md): the pinned ruff's `ruff format --check`
    passes, and a `# fmt: skip` marks only a module-level table written as a literal of
    plain rows (no lambda, no literal inside a call; no `# fmt: off`)."""
    import subprocess
    import sys

    from benchmarks.code_lines import pinned_ruff

    version = subprocess.run([sys.executable, "-m", "ruff", "--version"], capture_output=True)
    assert version.stdout.decode().split()[-1] == pinned_ruff(), "pip install the pinned ruff"
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", str(PACKAGE)], capture_output=True
    )
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
    tables = (ast.Dict, ast.List, ast.Tuple, ast.Set)
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = path.read_text().splitlines()
        assert not any(line.strip() in ("# fmt: off", "# fmt: on") for line in lines), path
        ends = {
            node.end_lineno
            for node in ast.parse("\n".join(lines)).body
            if isinstance(node, (ast.Assign, ast.AnnAssign))
            and isinstance(node.value, tables)
            and not any(isinstance(n, ast.Lambda) for n in ast.walk(node.value))
            and not any(
                isinstance(inner, tables)
                for call in ast.walk(node.value)
                if isinstance(call, ast.Call)
                for inner in ast.walk(call)
            )
        }
        skips = {i for i, line in enumerate(lines, 1) if line.rstrip().endswith("# fmt: skip")}
        assert skips <= ends, f"{path}: lines {sorted(skips - ends)} are not literal tables"
