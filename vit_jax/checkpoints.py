"""List a workdir's checkpoints and whether each verifies, without training.

    python -m vit_jax.checkpoints verify WORKDIR

Each checkpoint is restored on one device and checked against its integrity record:
every file there at its size, readable, every array hashing as saved, every value
finite (vit_jax/recovery.py). Nothing is changed; a training run sets aside what fails.
Exits 1 when a checkpoint under its final name fails.
"""

from __future__ import annotations

import sys

from absl import flags

from vit_jax import cli


def define_flags() -> None:
    flags.DEFINE_bool("json", False, "print one JSON object instead of the table")


def main(args: list[str]) -> None:
    """`args`: the words after the command ('verify', WORKDIR)."""
    import json

    from vit_jax import recovery

    if len(args) != 2 or args[0] != "verify":
        raise ValueError(f"expected: python -m vit_jax.checkpoints verify WORKDIR, got {args}")
    workdir = args[1]
    rows = recovery.verify_workdir(workdir)
    if flags.FLAGS.json:
        print(json.dumps(dict(rows)))
    else:
        width = max((len(name) for name, _ in rows), default=4)
        print(f"{'checkpoint':<{width}}  state" if rows else f"no checkpoints in {workdir}")
        for name, what in rows:
            print(f"{name:<{width}}  {what}", flush=True)
    if any(name.isdigit() and what.startswith(recovery.DAMAGED) for name, what in rows):
        sys.exit(1)


if __name__ == "__main__":
    words = [a for a in sys.argv[1:] if not a.startswith("-")]
    cli.run(lambda: main(words), define_flags, [a for a in sys.argv if a not in words])
