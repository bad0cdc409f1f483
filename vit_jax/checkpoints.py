"""List a workdir's checkpoints and whether each verifies, without training.

    python -m vit_jax.checkpoints verify WORKDIR [--json]

Each checkpoint is restored on one device and checked against its integrity record:
every file there at its size, readable, every array hashing as saved, every value
finite (vit_jax/workdir/checkpoints.py). Nothing is changed; a training run sets aside
what fails (into WORKDIR/damaged/, listed too). WORKDIR (local or gs://) is a run's
workdir (it holds checkpoints/) or a directory of them, such as the
recipe's (pretrain/, finetune/, scratch/): then every run workdir found up to two
levels below it is checked, its checkpoints named `pretrain/400`. Exits 1 when a
checkpoint under its final name fails, or with one line when a bucket does not answer
(that is not damage: run it again).
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

    from vit_jax.base import store
    from vit_jax.workdir import verify
    from vit_jax.workdir.checkpoints import DAMAGED, Checkpoints
    from vit_jax.workdir.workdir import run_workdirs

    if len(args) != 2 or args[0] != "verify":
        raise ValueError(f"expected: python -m vit_jax.checkpoints verify WORKDIR, got {args}")
    workdir = store.path(args[1].rstrip("/") or "/")
    runs = run_workdirs(workdir)
    if not runs:
        where = (
            "has no checkpoints/ directory, and no directory up to two levels below it has one"
            if workdir.is_dir()
            else "does not exist"
        )
        raise FileNotFoundError(
            f"{workdir} {where}: expected a run's workdir (with checkpoints/) or a directory "
            "of them, e.g. the recipe's workdir with pretrain/, finetune/ and scratch/"
        )
    rows = []
    for run in runs:
        prefix = "" if run == workdir else f"{run.relative_to(workdir)}/"
        found = verify.verify(Checkpoints(run / "checkpoints", read_only=True))
        rows += [(prefix + name, what) for name, what in found]
        if prefix and not found:
            rows.append((prefix, "no checkpoints"))
    if flags.FLAGS.json:
        print(json.dumps(dict(rows)))
    elif not rows:
        print(f"no checkpoints in {workdir}")
    else:
        width = max(len(name) for name, _ in [("checkpoint", ""), *rows])
        print(f"{'checkpoint':<{width}}  state")
        for name, what in rows:
            print(f"{name:<{width}}  {what}", flush=True)
    if any(_final(name) and what.startswith(DAMAGED) for name, what in rows):
        sys.exit(1)


def _final(name: str) -> bool:
    """Whether a row names a checkpoint under its final name ('200', 'pretrain/200'), not
    an interrupted save or one set aside ('damaged/200')."""
    return name.rsplit("/", 1)[-1].isdigit() and "damaged/" not in name


if __name__ == "__main__":
    words = [a for a in sys.argv[1:] if not a.startswith("-")]
    cli.run(lambda: main(words), define_flags, [a for a in sys.argv if a not in words])
