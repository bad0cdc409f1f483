"""A run config that cannot make sense is refused before anything is compiled, read or
written, every bad field named at once, one line each (vit_jax/training/check.py)."""

import math
import os

import pytest
from helpers import needs_embedded_data, run_command, snapshot, tiny_config

from vit_jax import configs, main, recipe
from vit_jax.configs import augreg, common, fashion_mnist, finetune, pretrain
from vit_jax.training import check, train


def every_preset() -> list[str]:
    """Every preset the package ships, with every argument it takes."""
    specs = [f"fashion_mnist:{a}" for a in fashion_mnist.ARGS]
    specs += [f"finetune:{m},{d}" for m in common.MODELS for d in finetune.DATASETS]
    specs += [f"pretrain:{m},{d}" for m in common.MODELS for d in pretrain.DATASETS]
    specs += [
        f"augreg:{m},{d},{s}"
        for m in common.MODELS
        for d in augreg.DATASETS
        for s in augreg.SETTINGS
    ]
    return specs + [f"augreg:tiny,{s}" for s in augreg.SETTINGS]


def numeric_fields(config, prefix: str = "") -> list[tuple[str, type]]:
    """('optimizer.lr', float) for every int and float field, set or a placeholder."""
    out = []
    for key in config.keys():
        value, kind = config[key], config.get_type(key)
        if hasattr(value, "keys"):
            out += numeric_fields(value, f"{prefix}{key}.")
        elif kind in (int, float):
            out.append((f"{prefix}{key}", kind))
    return out


def with_field(config, field: str, value):
    *sections, name = field.split(".")
    node = config
    for section in sections:
        node = node[section]
    node[name] = value
    return config


# Fields where a negative number is a legitimate setting: only NaN is nonsense there.
NEGATIVE_IS_FINE = {"model.head_bias_init", "model.init_head_bias"}


def nonsense(field: str, kind: type) -> list:
    values = [] if field in NEGATIVE_IS_FINE else [-7 if kind is int else -7.0]
    return values + ([math.nan] if kind is float else [])


def test_every_preset_passes_and_every_numeric_field_with_nonsense_is_refused(tmp_path):
    """Each numeric field of the shipped presets set to a nonsense value: train.run refuses
    it with one line that names the field and its value, before the workdir exists (each
    field and value once, in the first preset that has the field numeric)."""
    workdir = str(tmp_path / "run")
    walked, tried = set(), set()
    for spec in every_preset():
        assert check.problems(configs.get(spec)) == [], spec
        for field, kind in numeric_fields(configs.get(spec)):
            for value in nonsense(field, kind):
                if (field, repr(value)) in tried:
                    continue
                tried.add((field, repr(value)))
                config = with_field(configs.get(spec), field, value)
                with pytest.raises(check.ConfigError) as error:
                    train.run(config, workdir)
                line = str(error.value)
                assert "\n" not in line and line.startswith(f"{field}={value!r}: "), (spec, line)
                assert not os.path.exists(workdir), (spec, field)
                walked.add(field)
    # The walk reached the fields of every section: a field that is never numeric
    # anywhere would not show up, and nothing numeric was left out.
    assert {f.split(".")[0] for f in walked} >= {
        "seed", "model", "optimizer", "dataset", "fewshot", "mesh", "distributed", "store",
        "total_steps",
    }  # fmt: skip
    assert len(walked) >= 40


@pytest.mark.parametrize(
    "field,value,allowed",
    [
        ("fewshot.shots", (0, 5), "expected examples per class >= 1"),
        ("fewshot.shots", (), "expected examples per class >= 1"),
        ("dataset.randaugment", (2, 31), "magnitude=31"),
        ("dataset.randaugment", (-1, 10), "num_layers=-1"),
        ("dataset.classes", (-3,), "distinct class ids >= 0"),
        ("dataset.classes", (1, 1), "distinct class ids >= 0"),
        ("dataset.train_split", "train[:10", "expected 'name' or 'name[start:stop]'"),
        ("fewshot.test_split", "test[a:b]", "is not an integer or a percentage"),
        ("optimizer.name", "adamw", "expected one of 'adam', 'sgd'"),
        ("loss", "hinge", "expected one of 'softmax_xent', 'sigmoid_xent'"),
        ("optimizer.decay", "step", "expected one of 'cosine', 'linear', 'constant'"),
        ("optimizer.mu_dtype", "int8", "expected one of '', 'float32', 'bfloat16'"),
        ("optimizer.end_lr", 0.5, "expected a finite number in [0, 0.003]"),
        ("optimizer.b2", 1.0, "in [0, 1)"),
        ("model.classifier", "unpooled", "expected one of 'token', 'gap'"),
        ("model.posemb", "relative", "expected one of 'learned'"),
        ("model.name", "Q/16", "unknown model 'Q/16'"),
        ("model.num_heads", 5, "expected a divisor of the width (32)"),
        ("model.dtype", "float64", "expected one of 'float32', 'bfloat16', 'float16'"),
        ("image_size", 30, "expected a multiple of the model's 7 px per token, e.g. 28"),
        ("accum_steps", 5, "expected a divisor of batch_size (64)"),
        ("dataset.source", "webdataset", "expected one of 'idx', 'folder', 'tfds'"),
        ("dataset.crop_min_area", 0.0, "in (0, 1]"),
        ("dataset.label_smoothing", 1.0, "in [0, 1)"),
        ("mesh.data", 0, "expected -1 (every device left) or >= 1"),
    ],
)
def test_other_nonsense_names_the_field_and_what_is_allowed(field, value, allowed):
    config = with_field(tiny_config(), field, value)
    found = check.problems(config)
    assert [p.field for p in found] == [field] and allowed in found[0].allowed, found


def test_warmup_against_total_steps_and_every_problem_at_once():
    config = tiny_config(**{"total_steps": 30, "optimizer.warmup_steps": 500})
    error = pytest.raises(check.ConfigError, check.check, config, read_data=False).value
    assert str(error) == (
        "optimizer.warmup_steps=500: expected an integer from 0 to total_steps (30); set "
        "optimizer.warmup_steps=N with N <= 30 (a shorter run needs a shorter warmup)"
    )
    assert str(error.with_prefix("--config.")) == (  # as main says it: the flag to set
        "--config.optimizer.warmup_steps=500: expected an integer from 0 to total_steps (30); "
        "set --config.optimizer.warmup_steps=N with N <= 30 (a shorter run needs a shorter "
        "warmup)"
    )
    config = tiny_config(
        **{"total_steps": -5, "optimizer.lr": -1.0, "batch_size": -8, "dataset.mixup": -0.5}
    )
    assert str(pytest.raises(check.ConfigError, check.check, config).value).splitlines() == [
        "4 fields of the config cannot make sense:",
        "  total_steps=-5: expected an integer >= 1",
        "  batch_size=-8: expected an integer >= 1",
        "  optimizer.lr=-1.0: expected a finite number > 0",
        "  dataset.mixup=-0.5: expected a finite number >= 0 (Beta concentration; 0 turns it off)",
    ]


def test_devices_and_processes():
    config = tiny_config(**{"batch_size": 60, "eval_batch_size": 64, "mesh.fsdp": 3})
    found = check.device_problems(config, devices=8, processes=1)
    assert [p.line() for p in found] == [
        "mesh.fsdp=3: expected a divisor of the 8 devices",
        "batch_size=60: expected a multiple of 8 (8 devices x accum_steps 1) and of the 1 "
        "processes",
    ]
    config = tiny_config(**{"batch_size": 64, "accum_steps": 4, "mesh.data": 2, "mesh.fsdp": 2})
    assert [p.field for p in check.device_problems(config, devices=8, processes=3)] == [
        "mesh.data",
        "batch_size",
    ]
    assert check.device_problems(tiny_config(), devices=8, processes=2) == []


@needs_embedded_data
def test_data_problems_name_the_field(tmp_path):
    config = tiny_config(
        **{
            "dataset.train_split": "train[:70000]",
            "dataset.classes": (3, 11),
            "init_from": str(tmp_path / "missing.npz"),
        }
    )
    found = {p.field: p for p in check.data_problems(config)}
    assert sorted(found) == ["dataset.classes", "dataset.train_split", "init_from"]
    assert found["dataset.train_split"].allowed == (
        "boundary 70000 is beyond the 60000 examples of split 'train'."
    )
    assert "has 10 classes (ids 0..9); [11] do not exist" in found["dataset.classes"].allowed
    assert check.data_problems(config, init_from_later=True)[-1].field != "init_from"
    # Few-shot: the largest shot against the examples of each class of its train split.
    config = fashion_mnist.get_config("pretrain")
    config.fewshot.train_split = "train[:30]"
    [problem] = check.data_problems(config)
    assert problem.line().startswith("fewshot.shots=(1, 5, 10, 25): class 0 of fashion_mnist ")
    assert "has 6 examples (and 9 more classes); the largest shot takes 25" in problem.line()
    config.fewshot.shots = (1,)
    assert check.data_problems(config) == []
    # An empty data directory is the data_dir's problem.
    empty = tmp_path / "empty"
    empty.mkdir()
    [problem] = check.data_problems(tiny_config(**{"dataset.data_dir": str(empty)}))
    assert problem.field == "dataset.data_dir" and "has no train-images" in problem.allowed


@needs_embedded_data
def test_a_refused_command_leaves_the_workdir_as_it_found_it(tmp_path, capsys):
    workdir = tmp_path / "mine"
    workdir.mkdir()
    (workdir / "notes.txt").write_text("keep")
    before = snapshot(str(workdir))
    for flags in (
        ["--config.total_steps=-5"],
        ["--config.optimizer.lr=-1"],
        ["--config.optimizer.warmup_steps=500", "--config.total_steps=30"],
        ["--config.batch_size=-8"],
        ["--config.dataset.train_split=train[:70000]"],
    ):
        assert run_command(main, "--config=fashion_mnist:tiny", f"--workdir={workdir}", *flags) == 1
        err = capsys.readouterr().err.splitlines()
        assert err[0].startswith(f"error: {flags[0].split('=')[0]}="), err
        assert len(err) == 2 and err[1].startswith("(for the Python traceback")
        assert snapshot(str(workdir)) == before  # no events file, no lock, nothing
    new = tmp_path / "new" / "run"
    assert (
        run_command(main, "--config=fashion_mnist:tiny", f"--workdir={new}", "--config.seed=-1")
        == 1
    )
    assert "--config.seed=-1: expected an integer >= 0" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


@needs_embedded_data
def test_the_recipe_checks_its_three_parts_before_the_first_trains(tmp_path, capsys):
    from vit_jax.training import miniature

    bad = {"finetune": {"optimizer.lr": -0.1}, "scratch": {"total_steps": 0}}
    with pytest.raises(check.ConfigError) as error:
        miniature.run(str(tmp_path / "recipe"), overrides=bad)
    assert str(error.value).splitlines() == [
        "2 fields of the recipe's configs cannot make sense:",
        "  finetune: optimizer.lr=-0.1: expected a finite number > 0",
        "  scratch: total_steps=0: expected an integer >= 1",
    ]
    assert not (tmp_path / "recipe").exists() and capsys.readouterr().out == ""
    assert run_command(recipe, f"--workdir={tmp_path}/r", "--examples_per_class=0") == 1
    assert "--examples_per_class=0" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_setting_one_field_changes_no_other():
    """Each field of the base config is its own (two fields sharing one placeholder
    reference would move together)."""
    c = common.base("ViT-B_16")
    flat = lambda cfg: {k: v for k, v in cfg.items() if not hasattr(v, "items")}  # noqa: E731
    for section in ("model", "optimizer", "dataset", "fewshot", "distributed"):
        for field in flat(c[section]):
            fresh = common.base("ViT-B_16")
            before = dict(flat(fresh[section]))
            kind = fresh[section].get_ref(field).get_type()  # a placeholder's too
            value = {str: "other", bool: not before[field], float: 0.125, tuple: (7,)}.get(kind, 7)
            fresh[section][field] = value
            changed = {k for k, v in flat(fresh[section]).items() if v != before[k]}
            assert changed == {field}, (section, field, changed)
