"""Study 7: NaFlex against square images, in miniature (issue 54).

Fashion-MNIST items (28x28) placed at a random position on blank canvases of seven
shapes, from 28x84 to 84x28 px (height x width: 28 px on the short side, aspect ratios
1:3 to 3:1), written once as an image folder (PNG) in DIR/data, and a copy of it with
each canvas centre-cropped to its 28x28 square (DIR/data/cropped; off-centre items are
cut). The same small ViT (4 layers of width 64, 4x4 patches) is trained on the same
64 patches an image in three ways, and a fourth model on a mix of lengths:

  naflex_64   each canvas at its own aspect ratio in at most 64 patches (seq_lens=(64,))
  squash_32   each canvas resized to 32x32 (8x8 = 64 patches), aspect ratio lost
  crop_32     the cropped copy resized to 32x32
  naflex_mix  NaFlex at a length drawn each step from 16, 36, 64, 100, 147 patches, at
              the same 64x64 patches a step (tokens_per_batch)

Every model is evaluated at each token budget (16, 36, 64, 100, 147 patches for NaFlex;
16, 24, 32, 40, 48 px squares, 16-144 patches, for the square models, their position
embeddings resized by `weights.load`), and at 64 patches by canvas shape. STUDIES.md
reports the result:

    python studies/naflex.py --seeds=0,1,2 --workdir=workdirs/study_naflex
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import numpy as np

if __package__ in (None, ""):  # `python studies/naflex.py`: import from the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from studies import common  # noqa: E402

NAME = "naflex"
SETTINGS = ("naflex_64", "squash_32", "crop_32", "naflex_mix")
SHAPES = ((28, 84), (28, 56), (28, 42), (28, 28), (42, 28), (56, 28), (84, 28))  # (h, w)
SQUAREISH = ("28x28", "28x42", "42x28")  # aspect ratio within 3:2; the others 2:1 or more
BUDGETS = (16, 36, 64, 100, 147)  # patches of 4 px: 147 is a 28x84 canvas at its own size
SIDES = (16, 24, 32, 40, 48)  # the square models' sizes of about those budgets
EQUAL = 64  # the comparison's budget: NaFlex's 64 patches, 32 px squares
TRAIN_IMAGES, TEST_IMAGES = 4000, 1000  # of Fashion-MNIST's train and test splits
QUICK_IMAGES = 512, 128
STEPS = 400
DATA_SEED = 0  # which items, which canvas, where: the same data for every cell
LABELS = {"squareish": "squareish canvases", "elongated": "elongated canvases"}
LABELS |= {f"acc_{n}": f"at {n} patches" for n in BUDGETS}


def shape_name(h: int, w: int) -> str:
    return f"{h}x{w}"


def write_data(root: str, quick: bool) -> str:
    """The canvases and their centre-cropped copy as image folders under `root` (written
    once: DIR/train|test/<class>/NNNNN_HxW.png); returns `root`."""
    from PIL import Image

    from vit_jax.data import config as data_config
    from vit_jax.data import idx_source

    done = os.path.join(root, "written")
    if os.path.exists(done):
        return root
    rng = np.random.default_rng(DATA_SEED)
    counts = QUICK_IMAGES if quick else (TRAIN_IMAGES, TEST_IMAGES)
    sizes = dict(zip(("train", "test"), counts, strict=True))
    for split, n in sizes.items():
        images, labels = idx_source.load_split(data_config.DEFAULT_IDX_DIR, split)
        chosen = np.sort(rng.choice(len(images), n, replace=False))
        for k, i in enumerate(chosen):
            h, w = SHAPES[rng.integers(len(SHAPES))]
            y, x = rng.integers(h - 27), rng.integers(w - 27)
            canvas = np.zeros((h, w), np.uint8)
            canvas[y : y + 28, x : x + 28] = images[i, :, :, 0]
            s = min(h, w)
            top, left = (h - s) // 2, (w - s) // 2
            crop = canvas[top : top + s, left : left + s]
            for kind, pixels in (("canvas", canvas), ("cropped", crop)):
                folder = os.path.join(root, kind, split, str(labels[i]))
                os.makedirs(folder, exist_ok=True)
                name = f"{k:05d}_{shape_name(h, w)}.png"
                Image.fromarray(pixels, "L").save(os.path.join(folder, name))
    open(done, "w").close()
    return root


def config(setting: str, seed: int, data_root: str, quick: bool = False):
    """Study 1's model (4 layers of width 64, 4x4 patches, class token, learned position
    embeddings) and optimizer (Adam 2e-3, 40 warmup steps, linear decay), batch 64 (64
    patches each), 400 steps, flips and no Inception crop, on the canvases of `setting`."""
    from studies import posemb

    c = posemb.config("learned", seed, quick, steps=STEPS)
    folder = "cropped" if setting == "crop_32" else "canvas"
    c.dataset.update(source="folder", name=folder, data_dir=os.path.join(data_root, folder))
    c.dataset.cache = True
    c.dataset.crop_min_area = 1.0  # no crop: every window falls back to the whole canvas
    c.image_size = 32
    if setting == "naflex_64":
        c.dataset.naflex.seq_lens = (EQUAL,)
    elif setting == "naflex_mix":
        c.dataset.naflex.seq_lens = BUDGETS
        c.dataset.naflex.tokens_per_batch = c.batch_size * EQUAL  # 64 x 64 (quick: 32 x 64)
    return c


def evaluate(model, params, dataset, image_size: int, patch: int) -> np.ndarray:
    """Whether each test image (in the folder's order) is classified right; the labels
    are checked against `test_shapes`' order."""
    from vit_jax import data
    from vit_jax.evaluation.batched import over_batches
    from vit_jax.models import predict

    cfg = data.default_config()
    cfg.update(dataset)
    apply = predict.logits_fn(model)
    batches = data.eval_iterator(
        cfg,
        cfg.test_split,
        global_batch=200,
        image_size=image_size,
        patch_size=patch,
        process_index=0,
        process_count=1,
    )
    right, labels = [], []
    with batches:
        for logits, label in over_batches(lambda p, b: apply(p, b["image"]), params, batches):
            right.append(np.argmax(logits, -1) == label)
            labels.append(label)
    _, expected = test_shapes(dataset)
    if not np.array_equal(np.concatenate(labels), expected):
        raise AssertionError("the evaluation's order is not the folder's: shapes would mismatch")
    return np.concatenate(right)


def test_shapes(dataset) -> tuple[list[str], np.ndarray]:
    """Each test image's canvas shape ('28x84', from its file name) and label, in the
    folder's order (sorted by class, then file name; then sliced by the split spec)."""
    from vit_jax.data import folder_source, splits

    root, spec = dataset["data_dir"], dataset["test_split"]
    name = splits.split_name(spec)
    paths, labels = folder_source.scan_split(
        root, name, folder_source.list_classes(f"{root}/{name}")
    )
    part = splits.resolve(spec, len(paths))
    files = [os.path.basename(p) for p in paths[part.start : part.stop]]
    return [f.split("_")[1].removesuffix(".png") for f in files], labels[part.start : part.stop]


def by_shape(right: np.ndarray, shapes: list[str]) -> dict:
    """Accuracy by canvas shape, on the square-ish ones (within 3:2) and the elongated."""
    shapes = np.asarray(shapes)
    out = {"by_shape": {s: float(right[shapes == s].mean()) for s in sorted(set(shapes))}}
    square = np.isin(shapes, SQUAREISH)
    out["squareish"] = float(right[square].mean()) if square.any() else None
    out["elongated"] = float(right[~square].mean()) if (~square).any() else None
    return out


def cell(setting: str, seed: int, workdir: str, quick: bool) -> dict:
    """Trains `setting`, then evaluates its final.npz at each budget and, at 64 patches
    (32 px), by canvas shape: 'accuracy' is the one at 64 patches."""
    from vit_jax import weights

    root = os.path.dirname(os.path.dirname(workdir))
    data_root = write_data(os.path.join(root, "data_quick" if quick else "data"), quick)
    c = config(setting, seed, data_root, quick)
    summary = common.train_cell(c, workdir)
    final = os.path.join(workdir, "final.npz")
    dataset = c.dataset.to_dict()
    out = {"loop_accuracy": summary["accuracy"], "steps": summary["steps"]}
    for n, side in zip(BUDGETS, SIDES, strict=True):
        if c.dataset.naflex.seq_lens is not None:  # the table resized to each image's grid
            loaded = weights.load(final)
            dataset["naflex"] = {"seq_lens": (n,), "tokens_per_batch": 0}
        else:  # the table resized to side / 4 a side
            loaded = weights.load(final, None, (side, side), head=True)
        right = evaluate(loaded.model, loaded.params, dataset, side, c.model.patch_size)
        out[f"acc_{n}"] = float(right.mean())
        if n == EQUAL:
            out |= {"accuracy": float(right.mean()), **by_shape(right, test_shapes(dataset)[0])}
    return out


def paired(records: list[dict], a: str, b: str, metric: str) -> tuple[float, float] | None:
    """Mean ± std over seeds of `a` minus `b` in `metric` (points), same seed paired."""
    value = {(r["setting"], r["seed"]): r.get(metric) for r in records}
    seeds = sorted({r["seed"] for r in records})
    diffs = [
        100 * (value[a, k] - value[b, k])
        for k in seeds
        if value.get((a, k)) is not None and value.get((b, k)) is not None
    ]
    return common.mean_std(diffs) if diffs else None


def summary(records: list[dict]) -> str:
    """NaFlex against each square baseline (paired by seed), each model's accuracy at each
    budget, and the accuracy at 64 patches by canvas shape (mean over seeds, in %)."""
    lines = []
    for base in ("squash_32", "crop_32"):
        for metric in ("accuracy", "squareish", "elongated"):
            d = paired(records, "naflex_64", base, metric)
            if d is not None:
                what = LABELS.get(metric, "all canvases")
                lines.append(f"naflex_64 - {base}, {what}: {d[0]:+.2f} ± {d[1]:.2f} points")
    settings = [s for s in SETTINGS if any(r["setting"] == s for r in records)]
    head = " | ".join(settings)
    lines += ["", f"| patches (square models' side) | {head} |", "|---|" + "---|" * len(settings)]
    for n, side in zip(BUDGETS, SIDES, strict=True):
        values = common.by_setting(records, f"acc_{n}")
        stats = [common.mean_std([100 * v for v in values.get(s, [])]) for s in settings]
        lines.append(
            f"| {n} ({side} px) | " + " | ".join(f"{m:.2f} ± {d:.2f}" for m, d in stats) + " |"
        )
    lines += ["", f"| canvas (h x w) | {head} |", "|---|" + "---|" * len(settings)]
    for h, w in SHAPES:
        name = shape_name(h, w)
        cells = []
        for s in settings:
            vals = [
                r["by_shape"][name] for r in records if r["setting"] == s and name in r["by_shape"]
            ]
            cells.append(f"{100 * np.mean(vals):.1f}" if vals else "-")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(records: list[dict], path: str) -> None:
    """Left: accuracy at 64 patches, squarish and elongated canvases; right: accuracy
    against the patches an image is given (square models: 16-48 px, 16-144 patches)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    shown = [s for s in SETTINGS if any(r["setting"] == s for r in records)]
    for j, metric in enumerate(("accuracy", "squareish", "elongated")):
        values = common.by_setting(records, metric)
        for i, s in enumerate(shown):
            vals = [100 * v for v in values.get(s, [])]
            if vals:
                m, sd = common.mean_std(vals)
                label = (LABELS.get(metric, "all canvases")) if i == 0 else None
                left.bar(
                    i + 0.27 * (j - 1),
                    m,
                    0.25,
                    yerr=sd,
                    capsize=3,
                    color=f"C{j}",
                    alpha=0.7,
                    label=label,
                )
                left.plot([i + 0.27 * (j - 1)] * len(vals), vals, "k.", ms=3)
    left.set_xticks(range(len(shown)), shown)
    low = min(
        100 * r[m] for r in records for m in ("accuracy", "squareish", "elongated") if r.get(m)
    )
    left.set_ylim(max(0.0, low - 5), None)
    left.set_ylabel("test accuracy at 64 patches (%)")
    left.legend(fontsize=8, loc="lower left")
    for i, s in enumerate(shown):
        patches = BUDGETS if s.startswith("naflex") else [side * side // 16 for side in SIDES]
        values = [common.by_setting(records, f"acc_{n}").get(s, []) for n in BUDGETS]
        common.error_bars(right, list(zip(patches, values, strict=True)), s, f"C{i + 3}")
    right.set_xlabel("patches an image (4 px)")
    right.set_ylabel("test accuracy (%)")
    right.legend(fontsize=8)
    fig.suptitle(
        f"NaFlex against square images: ViT 4x64, {STEPS} steps, canvases 28x84 to 84x28",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> list[dict]:
    metrics = ("accuracy", "squareish", "elongated")
    return common.run_study(NAME, SETTINGS, cell, argv, metrics, plot, LABELS, summary)


if __name__ == "__main__":
    main()
