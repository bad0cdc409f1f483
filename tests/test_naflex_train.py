"""NaFlex training (dataset.naflex): one length schedule for every process and every
resume, its batches as the model takes them, a killed run that ends bit-identical, and a
square checkpoint fine-tuned as NaFlex."""

import numpy as np
import pytest
from helpers import assert_npz_equal, needs_embedded_data, tiny_config
from subprocesses import Run, tiny_flags

from vit_jax import data
from vit_jax.base.problems import ConfigError
from vit_jax.data import augment, naflex, pipeline
from vit_jax.training import check, train

PATCH = 7


def naflex_config(**fields):
    cfg = data.default_config()
    cfg.train_split, cfg.threads = "train[:300]", 2
    cfg.naflex.seq_lens, cfg.naflex.tokens_per_batch = (4, 9, 16), 96
    cfg.update(fields)
    return cfg


def train_batch(cfg, index: int, count: int) -> pipeline.TrainBatch:
    lengths = naflex.Lengths(tuple(cfg.naflex.seq_lens), cfg.naflex.tokens_per_batch, 4, 3)
    return pipeline.TrainBatch(cfg, cfg.train_split, (28, 28), 3, 0, index, count, lengths, PATCH)


def assert_batches_equal(got, want):
    for key in ("patches", "coords", "valid"):
        np.testing.assert_array_equal(got["image"][key], want["image"][key], err_msg=key)
    np.testing.assert_array_equal(got["label"], want["label"])


@needs_embedded_data
def test_two_processes_read_the_halves_of_one_schedule_across_epochs_and_blocks():
    cfg = naflex_config()
    whole, halves = train_batch(cfg, 0, 1), [train_batch(cfg, k, 2) for k in (0, 1)]
    seen = set()
    for step in (0, 1, 2, 1023, 1024, 1030):  # 300 examples: epochs end inside steps
        want = whole(step)
        n, b = whole.lengths.length(step), whole.lengths.batch_at(step)
        seen.add(n)
        assert want["image"]["patches"].shape == (b, n, PATCH * PATCH * 3)
        assert b == 96 // n // 4 * 4 and want["label"].shape == (b, 10)
        parts = [half(step) for half in halves]
        joined = {
            "image": {
                k: np.concatenate([p["image"][k] for p in parts])
                for k in ("patches", "coords", "valid")
            },
            "label": np.concatenate([p["label"] for p in parts]),
        }
        assert_batches_equal(joined, want)
        # Fashion-MNIST is square: each crop keeps its window's shape, the grid fills the row
        # as far as whole patches allow, and every real patch comes first.
        valid = want["image"]["valid"]
        assert valid.sum(1).min() >= 1 and (valid[:, 1:] <= valid[:, :-1]).all()
    assert seen == {4, 9, 16}


@needs_embedded_data
def test_a_resumed_iterator_yields_the_steps_an_uninterrupted_one_yields():
    cfg, kw = naflex_config(), dict(image_size=28, seed=3, patch_size=PATCH, batch_multiple=4)
    kw.update(process_index=0, process_count=1, global_batch=8)
    with data.train_iterator(cfg, **kw) as it:
        first = [next(it) for _ in range(6)]
    with data.train_iterator(cfg, start_step=4, **kw) as it:
        again = [next(it) for _ in range(2)]
    for got, want in zip(again, first[4:], strict=True):
        assert_batches_equal(got, want)
    sizes = [len(b["label"]) for b in first]
    assert len(set(sizes)) > 1 and all(s % 4 == 0 for s in sizes)


@needs_embedded_data
def test_eval_batches_hold_each_whole_image_at_the_largest_length():
    cfg = naflex_config(test_split="test[:5]")
    kw = dict(global_batch=8, image_size=28, patch_size=PATCH, process_index=0, process_count=1)
    with data.eval_iterator(cfg, cfg.test_split, **kw) as it:
        (b,) = list(it)
    np.testing.assert_array_equal(b["mask"], [1] * 5 + [0] * 3)
    x = b["image"]
    # A 28 px square at 16 patches of 7 px: its own 4 x 4 grid, the pixels themselves.
    assert x["valid"][:5].sum(1).tolist() == [16] * 5
    assert x["valid"][5:].sum(1).tolist() == [1] * 3  # padding rows: one zero patch
    images, _ = data.idx_source.load_split(data.DEFAULT_IDX_DIR, "test")
    want = naflex.empty(1, 16, PATCH)
    naflex.put(want, 0, images[0], PATCH)
    np.testing.assert_array_equal(x["patches"][:1], want["patches"])


def test_a_naflex_crop_keeps_the_image_shape_up_to_the_inception_jitter():
    """A 30 x 120 image (4:1): the square path's crops are 3:4 to 4:3 wherever they fit;
    NaFlex's (own_aspect) are 4:1 times that jitter, so the shape survives the crop."""
    rng = np.random.default_rng(0)
    draws = rng.random((300, augment.DRAWS))
    flex = [augment.crop_window(30, 120, u, 0.3, own_aspect=True) for u in draws]
    ratios = np.array([cw / ch for _, _, ch, cw in flex])
    assert ratios.min() > 4 * 3 / 4 * 0.9 and ratios.max() < 4 * 4 / 3 * 1.1, ratios
    assert 3.7 < np.median(ratios) < 4.3 and len({w[2:] for w in flex}) > 50
    square = [augment.crop_window(30, 120, u, 0.3) for u in draws]
    fitted = [cw / ch for _, _, ch, cw in square if (ch, cw) != (30, 120)]
    assert fitted and max(fitted) < 4 / 3 * 1.1  # where a square-ish window fits at all


def test_naflex_fields_that_cannot_work_are_refused_in_one_line(tmp_path):
    config = tiny_config(**{"dataset.naflex.seq_lens": (16,), "dataset.mixup": 0.2})
    assert [p.field for p in check.problems(config)] == ["dataset.mixup"]
    config = tiny_config(**{"dataset.naflex.seq_lens": (16, 0)})
    assert "dataset.naflex.seq_lens" in str(check.problems(config)[0])
    config = tiny_config(**{"dataset.naflex.seq_lens": (16,), "model.name": "R+ViT-Ti_16"})
    config.model.update(width=None, depth=None, num_heads=None, mlp_dim=None, patch_size=None)
    assert any("hybrid" in str(p) for p in check.problems(config))
    cfg = naflex_config(train_split="train[:10]")
    cfg.naflex.tokens_per_batch = 20
    with pytest.raises(ValueError, match=r"tokens_per_batch=20 is too small for a step of length "
                       r"16, which takes 4 images at least .* the smallest budget that works is 64 "
                       r"patches$"):
        data.train_iterator(cfg, global_batch=8, image_size=28, seed=0, patch_size=7,
                            batch_multiple=4, process_index=0, process_count=1)  # fmt: skip
    # The run says it before it touches the workdir: 8 devices, accum_steps 2 -> 16 a batch.
    config = tiny_config(accum_steps=2, **{"dataset.naflex.seq_lens": (9, 16)})
    config.dataset.naflex.tokens_per_batch = 200
    (problem,) = check.device_problems(config, 8, 1)
    assert problem.line() == (
        "dataset.naflex.tokens_per_batch=200: too small for a step of length 16, which takes "
        "16 images at least (devices x accum_steps): the smallest budget that works is 256 "
        "patches; set dataset.naflex.tokens_per_batch=N >= 256"
    )
    with pytest.raises(ConfigError, match="dataset.mixup"):
        train.run(tiny_config(**{"dataset.naflex.seq_lens": (9,), "dataset.mixup": 0.5}), tmp_path)


@needs_embedded_data
def test_a_square_checkpoint_fine_tunes_as_naflex(tmp_path, capsys):
    square = train.run(tiny_config(total_steps=4), str(tmp_path / "square"))
    assert square["steps"] == 4
    flex = {"dataset.naflex.seq_lens": (9, 16), "init_from": str(tmp_path / "square/final.npz")}
    summary = train.run(tiny_config(total_steps=4, **flex), str(tmp_path / "flex"))
    out = capsys.readouterr().out
    assert "fine-tuning from" in out
    # tokens_per_batch 0: batch_size 64 x 16 patches; 1,024 // 9 = 113 -> 112, 8 devices
    assert (
        "NaFlex, 1,024 patches a step: 112 images of 9 patches + class token, 64 images of 16 "
        "patches + class token; the step compiles once for each of the 2 lengths" in out
    ), out
    assert "compiled for 9 patches a row" in out and "compiled for 16 patches a row" in out
    assert summary["steps"] == 4 and 0.0 <= summary["accuracy"] <= 1.0


@pytest.mark.slow
@needs_embedded_data
def test_a_killed_naflex_run_ends_bit_identical(tmp_path):
    flags = {"dataset.naflex.seq_lens": "(4,9,16)", "total_steps": 16, "checkpoint_every": 4}
    flags.update({"log_every": 1, "eval_every": 0, "model.dropout": 0.1})
    cache = {"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "jax_cache")}
    ref, killed = str(tmp_path / "ref"), str(tmp_path / "killed")
    with Run(tiny_flags(ref, **flags), devices=4, env=cache) as run:
        assert run.finish() == 0, run.tail()
    with Run(tiny_flags(killed, **flags), devices=4, env=cache) as run:
        run.wait_for(lambda line: line.startswith("step 10/16"))
        run.kill()
    with Run(tiny_flags(killed, **flags), devices=4, env=cache) as run:
        assert run.finish() == 0, run.tail()
        assert any(line.startswith("resuming from step") for line in run.log), run.tail()
    assert_npz_equal(f"{killed}/final.npz", f"{ref}/final.npz")
