"""The commands the README and docs/ print are commands that work: each names a command,
only flags that command defines, and config presets and fields that exist; the README's
quickstarts run as printed (with a small model and a folder of images in place of the
published file and the user's)."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import numpy as np
import pytest
from helpers import ROOT, defined_flags, needs_embedded_data, random_params, run_command
from PIL import Image

from vit_jax import configs

PAGES = [Path(ROOT) / "README.md", *sorted((Path(ROOT) / "docs").glob("*.md"))]
COMMANDS = {"main", "recipe", "infer", "evaluate", "fewshot", "figures", "convert",
            "checkpoints", "plan"}  # fmt: skip


def commands(page: Path) -> list[list[str]]:
    """The `python -m vit_jax.NAME ...` lines of a page's bash blocks, as argv (continued
    lines joined, comments dropped)."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", page.read_text(), re.S):
        text = block.replace("\\\n", " ")
        for line in text.splitlines():
            line = line.split(" #", 1)[0].strip()
            if line.startswith("python -m vit_jax."):
                out.append(shlex.split(line)[2:])
    return out


ALL = [(page.name, argv) for page in PAGES for argv in commands(page)]


def test_the_pages_print_commands():
    names = {page for page, _ in ALL}
    assert {"README.md", "training.md", "pods.md", "planning.md", "formats.md"} <= names
    assert len(ALL) >= 20


@pytest.fixture(scope="module")
def flags_of():
    return {name: defined_flags(f"vit_jax.{name}") for name in COMMANDS}


@pytest.mark.parametrize("page, argv", ALL, ids=[f"{p}:{' '.join(a)[:60]}" for p, a in ALL])
def test_a_printed_command_parses(page, argv, flags_of):
    name = argv[0].removeprefix("vit_jax.")
    assert name in COMMANDS, argv
    config = None
    for arg in argv[1:]:
        if not arg.startswith("--"):
            assert name == "checkpoints", arg  # `checkpoints verify WORKDIR` takes words
            continue
        flag, _, value = arg[2:].partition("=")
        if flag.startswith("config."):
            assert config is not None, f"{arg} before --config"
            section, *path = flag.split(".")[1:]
            node = config
            for field in [section, *path]:
                assert field in node, f"{page}: {arg}: no config field {flag}"
                node = node[field]
        else:
            assert flag.removeprefix("no") in flags_of[name] | {"help"}, f"{page}: {arg}"
        if flag == "config":  # a preset, or its copy in configs/ (the same get_config)
            preset, _, arg = value.partition(":")
            preset = Path(preset).stem if preset.endswith(".py") else preset
            config = configs.get(f"{preset}:{arg}" if arg else preset)


@needs_embedded_data
@pytest.mark.slow
def test_the_fine_tuning_quickstart_runs_as_printed(tmp_path, monkeypatch, capsys):
    """The README's second quickstart, on a folder of two classes, from a small model's
    .npz in place of the published file and at 32 px for a few steps (the flags appended
    after the printed ones win); then its infer line names a class of the folder."""
    from vit_jax import infer, main
    from vit_jax.models import get_model
    from vit_jax.weights import save_npz

    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    for split, n in (("train", 8), ("test", 4)):
        for k, name in enumerate(("cat", "dog")):
            os.makedirs(f"MY_IMAGES/{split}/{name}")
            for i in range(1, n + 1):
                pixels = rng.integers(0, 80, (40, 40, 3)).astype(np.uint8) + 120 * k
                Image.fromarray(pixels).save(f"MY_IMAGES/{split}/{name}/{i}.jpg")
    save_npz("base.npz", random_params(get_model("testing", 5, patch_size=8), 32))
    fine_tune, classify = [a for p, a in ALL if p == "README.md" and a[0] in (
        "vit_jax.main", "vit_jax.infer") and any("MY_IMAGES" in x for x in a)]  # fmt: skip
    argv = [a.replace("gs://vit_models/imagenet21k/ViT-B_16.npz", "base.npz") for a in fine_tune]
    small = ["--config.model.name=testing", "--config.model.patch_size=8", "--config.image_size=32",
             "--config.batch_size=8", "--config.eval_batch_size=8", "--config.total_steps=4",
             "--config.optimizer.warmup_steps=2", "--config.eval_every=2",
             "--config.checkpoint_every=2", "--config.progress_bars=False"]  # fmt: skip
    assert run_command(main, *argv[1:], *small) == 0
    assert os.path.exists("workdirs/my_b16/final.npz")
    capsys.readouterr()
    assert run_command(infer, *classify[1:]) == 0
    first = capsys.readouterr().out.splitlines()[1]
    assert re.match(r"\s+1\. (cat|dog)\s", first), first
