"""A model trained on named classes keeps their names in every file the package writes
(npz, timm, hf, onnx), and every command uses them: infer prints them, evaluate matches
a dataset's classes to the head's by name, convert carries them on."""

import json
import os

import numpy as np
import pytest
from helpers import needs_embedded_data, run_command, tiny_config
from PIL import Image

from vit_jax import convert, evaluate, infer, main, weights
from vit_jax.data import tables
from vit_jax.evaluation import classify
from vit_jax.training import train
from vit_jax.weights import safetensors_io

CLASSES = ("cat", "dog", "fox")


def image_folder(root, per_class: int = 12, size: int = 28) -> str:
    """train/ and test/ with one directory per class; class k is bright in band k."""
    rng = np.random.default_rng(0)
    for split, n in (("train", per_class), ("test", per_class // 2)):
        for k, name in enumerate(CLASSES):
            os.makedirs(f"{root}/{split}/{name}", exist_ok=True)
            for i in range(n):
                image = rng.integers(0, 60, (size, size, 3), dtype=np.uint8)
                image[:, k * size // 3 : (k + 1) * size // 3] += 180
                Image.fromarray(image).save(f"{root}/{split}/{name}/{i:02d}.png")
    return str(root)


@pytest.fixture(scope="module")
def folder_run(tmp_path_factory):
    """fashion_mnist:tiny's model trained on an image folder: (folder, workdir)."""
    root = image_folder(tmp_path_factory.mktemp("pets"))
    workdir = str(tmp_path_factory.mktemp("run"))
    config = tiny_config(
        **{"dataset.source": "folder", "dataset.data_dir": root, "dataset.train_split": "train",
           "dataset.test_split": "test", "batch_size": 16, "eval_batch_size": 16}
    )  # fmt: skip
    train.run(config, workdir)
    return root, workdir


def test_the_run_writes_the_folder_names_into_final_npz(folder_run):
    _, workdir = folder_run
    loaded = weights.load(f"{workdir}/final.npz")
    assert loaded.labels == list(CLASSES) and loaded.model.num_classes == 3
    # The original code's reader sees one more entry, which it leaves unread.
    with np.load(f"{workdir}/final.npz") as f:
        assert json.loads(str(f["vit_jax_labels"])) == list(CLASSES)


def test_infer_prints_the_class_names(folder_run, capsys):
    root, workdir = folder_run
    image = f"{root}/test/fox/00.png"
    assert run_command(infer, f"--checkpoint={workdir}/final.npz", f"--image={image}") == 0
    rows = capsys.readouterr().out.strip().splitlines()[1:]
    assert sorted(row.split()[1] for row in rows) == sorted(CLASSES)  # '1. fox  91.2%  (class 2)'
    assert sorted(row.split("(class ")[1] for row in rows) == ["0)", "1)", "2)"]


def test_evaluate_a_folder_needs_no_dataset_name_and_matches_classes_by_name(
    folder_run, tmp_path, capsys
):
    root, workdir = folder_run
    args = [f"--checkpoint={workdir}/final.npz", "--source=folder", "--progress=false"]
    assert run_command(evaluate, *args, f"--data_dir={root}") == 0
    line, js = capsys.readouterr().out.strip().splitlines()[-2:]
    whole = json.loads(js)
    assert whole["examples"] == 18 and whole["classes"] is None and "top5" not in whole
    assert "top-5" not in line and f"on {os.path.basename(root)} test" in line
    # Another folder with two of the classes, and one the model never saw: the two are
    # scored against the head classes of their names, the stranger is left out.
    other = tmp_path / "other"
    for name, source in (("fox", "fox"), ("cat", "cat"), ("bird", "dog")):
        os.makedirs(other / "test" / name)
        for f in sorted(os.listdir(f"{root}/test/{source}")):
            os.link(f"{root}/test/{source}/{f}", other / "test" / name / f)
    assert run_command(evaluate, *args, f"--data_dir={other}") == 0
    line, js = capsys.readouterr().out.strip().splitlines()[-2:]
    part = json.loads(js)
    assert part["matched_by_name"] and part["examples"] == 12
    assert "(matched to the head's classes by name)" in line  # docs/inspection.md says so
    assert part["classes"] == [1, 2]  # sorted names: bird 0, cat 1, fox 2
    model, params, size = weights.load_model(f"{workdir}/final.npz")
    dataset = {"source": "folder", "data_dir": root, "classes": (0, 2)}  # cat, fox
    want = classify.evaluate(model, params, dataset, "test", size, label_map=[0, 2], progress=False)
    assert part["top1"] == want["top1"] and want["examples"] == 12


def test_every_format_carries_the_names(folder_run, tmp_path, capsys):
    _, workdir = folder_run
    src = f"{workdir}/final.npz"
    assert (
        run_command(convert, f"--checkpoint={src}", "--format=timm", f"--out={tmp_path}/m.st") == 0
    )
    meta = safetensors_io.read_metadata(tmp_path / "m.st")
    assert json.loads(meta["labels"]) == list(CLASSES)
    assert run_command(convert, f"--checkpoint={src}", "--format=hf", f"--out={tmp_path}/hf") == 0
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert cfg["id2label"] == {"0": "cat", "1": "dog", "2": "fox"}
    for back in (tmp_path / "m.st", tmp_path / "hf"):  # and back to npz: still named
        out = tmp_path / f"{back.name}.npz"
        assert run_command(convert, f"--checkpoint={back}", "--format=npz", f"--out={out}") == 0
        assert weights.load(out).labels == list(CLASSES)
    onnx = pytest.importorskip("onnx")
    assert (
        run_command(convert, f"--checkpoint={src}", "--format=onnx", f"--out={tmp_path}/m.onnx")
        == 0
    )
    props = {p.key: p.value for p in onnx.load(str(tmp_path / "m.onnx")).metadata_props}
    assert json.loads(props["labels"]) == list(CLASSES)
    # --labels says other names; a new head (--num_classes) drops the stored ones.
    (tmp_path / "names.txt").write_text("tabby\nbeagle\nred fox\n")
    flags = [f"--checkpoint={src}", "--format=npz", f"--labels={tmp_path}/names.txt"]
    assert run_command(convert, *flags, f"--out={tmp_path}/renamed.npz") == 0
    assert weights.load(tmp_path / "renamed.npz").labels == ["tabby", "beagle", "red fox"]
    flags = [f"--checkpoint={src}", "--format=npz", "--num_classes=4"]
    assert run_command(convert, *flags, f"--out={tmp_path}/new_head.npz") == 0
    assert weights.load(tmp_path / "new_head.npz").labels is None
    capsys.readouterr()


@needs_embedded_data
def test_a_head_of_classes_5_to_9_evaluates_on_fashion_mnist_without_flags(tmp_path, capsys):
    """The main job's fine-tuned head (classes 5-9) on the whole dataset: its names keep
    the five classes it knows, as --classes=5,6,7,8,9 would."""
    config = tiny_config(**{"dataset.classes": (5, 6, 7, 8, 9), "total_steps": 4})
    train.run(config, str(tmp_path / "run"))
    path = tmp_path / "run" / "final.npz"
    assert weights.load(path).labels == list(tables.IDX_CLASS_NAMES["fashion_mnist"][5:])
    args = [f"--checkpoint={path}", "--dataset=fashion_mnist", "--split=test[:300]"]
    assert run_command(evaluate, *args, "--progress=false") == 0
    by_name = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert run_command(evaluate, *args, "--progress=false", "--classes=5,6,7,8,9") == 0
    by_flag = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert by_name["classes"] == by_flag["classes"] == [5, 6, 7, 8, 9]
    assert by_name["top1"] == by_flag["top1"] and by_name["examples"] == by_flag["examples"]


def test_an_augreg_preset_on_a_small_folder_names_the_split_field(tmp_path, capsys):
    root = image_folder(tmp_path / "pets", per_class=4)
    flags = ["--config=augreg:tiny", f"--workdir={tmp_path}/run", "--config.dataset.source=folder",
             f"--config.dataset.data_dir={root}"]  # fmt: skip
    assert run_command(main, *flags) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("error: 2 fields of the config cannot make sense:")
    assert err[1] == (
        "  --config.dataset.train_split='train[:512]': boundary 512 is beyond the 12 "
        "examples of split 'train'."
    )
    assert err[2].startswith("  --config.dataset.test_split='test[:256]': boundary 256")
    assert not (tmp_path / "run").exists()
