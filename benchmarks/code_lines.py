"""Lines of code of the package: every module of vit_jax/ (the commands at the top and
the library under its folders), counting lines that hold code, not docstrings, comments or
blank lines; and the house's limits: files over 350 lines and functions over 60.

    python benchmarks/code_lines.py [--by-file] [--ref=GIT_REF]

With --ref, the same count over the package as it was at that commit (read with git
show), for a before/after.
"""

from __future__ import annotations

import argparse
import ast
import io
import subprocess
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIPPED = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
           tokenize.ENDMARKER, tokenize.ENCODING}  # fmt: skip


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
    names = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", ref, "vit_jax"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    names = [n for n in names if n.endswith(".py")]
    git = dict(cwd=ROOT, capture_output=True, text=True, check=True)
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
    counts = {path: code_lines(src) for path, src in library_files(args.ref).items()}
    if args.by_file:
        for path, n in sorted(counts.items(), key=lambda kv: -kv[1]):
            print(f"{n:6d}  {path}")
    where = args.ref or "the working tree"
    files = library_files(args.ref)
    over = over_limits(files)
    print(f"over the limits (files 350 lines, functions 60): {', '.join(over) or 'none'}")
    print(f"{sum(counts.values())} code lines in {len(counts)} modules of vit_jax/ ({where})")


if __name__ == "__main__":
    main()
