"""Lines of code of the package as ruff formats it: every module of vit_jax/ (the commands
at the top and the library under its folders), on a copy with every formatter override
(`# fmt: skip`, `# fmt: off`) taken out and formatted by the ruff version pyproject.toml
pins, counting lines that hold code, not docstrings, comments or blank lines; the
overrides left in the package; and the house's limits on the package as it is: files
over 350 lines and functions over 60.

    python benchmarks/code_lines.py [--by-file] [--ref=GIT_REF]

With --ref, the same count over the package as it was at that commit (read with git
show), for a before/after.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import subprocess
import sys
import tempfile
import tokenize
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIPPED = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENDMARKER,
    tokenize.ENCODING,
}
OVERRIDE = re.compile(r"^\s*# fmt: (?:off|on)\s*$|\s*# fmt: skip\s*$", re.M)


def pinned_ruff() -> str:
    """The ruff version of pyproject.toml's `test` extra ('ruff==X')."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = [r for r in extras["optional-dependencies"]["test"] if r.startswith("ruff==")]
    return pins[0].removeprefix("ruff==")


def formatted(files: dict[str, str]) -> dict[str, str]:
    """{path: source} as the pinned ruff formats it, with no formatter override.

    Raises:
        SystemExit: another ruff, or none, is installed (naming the install).
    """
    want = pinned_ruff()
    found = subprocess.run([sys.executable, "-m", "ruff", "--version"], capture_output=True)
    if found.stdout.decode().split()[-1:] != [want]:
        sys.exit(f"code_lines.py counts as ruff {want} formats: pip install ruff=={want}")
    with tempfile.TemporaryDirectory() as tmp:
        for path, source in files.items():
            (Path(tmp) / path).parent.mkdir(parents=True, exist_ok=True)
            (Path(tmp) / path).write_text(OVERRIDE.sub("", source))
        config = ["--config", str(ROOT / "pyproject.toml")]
        subprocess.run([sys.executable, "-m", "ruff", "format", "-q", *config, tmp], check=True)
        return {path: (Path(tmp) / path).read_text() for path in files}


def overrides(files: dict[str, str]) -> int:
    """How many formatter overrides the sources hold."""
    return sum(len(OVERRIDE.findall(source)) for source in files.values())


def code_lines(source: str) -> int:
    """Lines with at least one token that is not a comment, a docstring or layout."""
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                docstrings |= set(range(value.lineno, value.end_lineno + 1))
    lines = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in SKIPPED:
            continue
        for line in range(tok.start[0], tok.end[0] + 1):
            if line not in docstrings:
                lines.add(line)
    return len(lines)


def library_files(ref: str | None) -> dict[str, str]:
    """{path: source} of the modules of vit_jax/, now or at `ref`."""
    if ref is None:
        paths = sorted((ROOT / "vit_jax").rglob("*.py"))
        return {str(p.relative_to(ROOT)): p.read_text() for p in paths}
    git = dict(cwd=ROOT, capture_output=True, text=True, check=True)
    names = subprocess.run(["git", "ls-tree", "-r", "--name-only", ref, "vit_jax"], **git)
    names = [n for n in names.stdout.split() if n.endswith(".py")]
    return {n: subprocess.run(["git", "show", f"{ref}:{n}"], **git).stdout for n in names}


def over_limits(files: dict[str, str], file_lines: int = 350, function_lines: int = 60):
    """['vit_jax/x.py: 351 lines', 'vit_jax/y.py:f: 61 lines', ...]: files over
    `file_lines` lines and functions over `function_lines`, each counted whole."""
    out = []
    for path, source in files.items():
        if (n := len(source.splitlines())) > file_lines:
            out.append(f"{path}: {n} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if (n := node.end_lineno - node.lineno + 1) > function_lines:
                    out.append(f"{path}:{node.name}: {n} lines")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--by-file", action="store_true", help="one line per module")
    parser.add_argument("--ref", default=None, help="count at this git commit instead")
    args = parser.parse_args()
    files = library_files(args.ref)
    counts = {path: code_lines(src) for path, src in formatted(files).items()}
    if args.by_file:
        for path, n in sorted(counts.items(), key=lambda kv: -kv[1]):
            print(f"{n:6d}  {path}")
    where = args.ref or "the working tree"
    over = over_limits(files)
    print(f"over the limits (files 350 lines, functions 60): {', '.join(over) or 'none'}")
    print(f"formatter overrides (# fmt: skip, off, on): {overrides(files)}")
    print(
        f"{sum(counts.values())} code lines in {len(counts)} modules of vit_jax/ ({where}), "
        f"as ruff {pinned_ruff()} formats them without overrides"
    )


if __name__ == "__main__":
    main()
