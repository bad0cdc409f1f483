"""All the section 4.5 numbers for one model and a few images, and writing them out.

`compute` returns the arrays; `write` saves them (inspect.npz, inspect.json) and draws
one PNG per figure. A figure that does not apply (pixel filters of a hybrid, position
embeddings of a model without them) is skipped with the reason in `skipped`, printed
by the command and recorded in inspect.json.

A NaFlex batch (models/naflex.py) goes where images go: the rollout and relevance maps are
then each image's own grid, lists, saved as `rollout/0`, `rollout/1`, ... in inspect.npz
(`naflex_images` gives the images to draw them over); the position embeddings' similarity
is the stored table's, at its own grid.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.base import files, store
from vit_jax.evaluation.batched import eval_batches
from vit_jax.inspection import attention, filters, plots, posemb
from vit_jax.inspection.relevance import attention_of, in_batches, relevance
from vit_jax.models import naflex, predict
from vit_jax.models.vit import VisionTransformer

PNG = {
    "filters": "filters_pca.png",
    "posemb": "posemb_similarity.png",
    "distance": "attention_distance.png",
    "rollout": "attention_rollout.png",
    "relevance": "relevance.png",
}
NUMBERS, SUMMARY = "inspect.npz", "inspect.json"
# The rollout's row into the representation, by classifier (attention.flow).
ROWS = {
    "token": "the class token's row",
    "map": "the MAP head's attention (mean over heads) x that",
}


@dataclasses.dataclass
class Inspection:
    """What `compute` found.

    Attributes:
      arrays: name -> array, as saved in inspect.npz:
        filters_pca_components [k, P, P, C], filters_pca_explained_variance [k],
        filters_pca_variance_ratio [k], posemb_similarity [gh, gw, gh, gw],
        attention_distance [L, H] (mean over images, pixels),
        attention_distance_per_image [L, B, H], rollout [B, gh, gw]; with `explain`,
        relevance [B, K, gh, gw], relevance_classes [B, K] (the head's indices) and
        relevance_probabilities [B, K]. A NaFlex batch's rollout and relevance: lists
        of each image's [gh, gw] and [K, gh, gw]. With registers beside a class token,
        register_share [B, 2]: their share of its attention (last layer, rollout).
      info: sizes and definitions (saved in inspect.json).
      skipped: figure -> why it does not apply to this model.
    """

    arrays: dict[str, np.ndarray]
    info: dict[str, Any]
    skipped: dict[str, str]


@functools.lru_cache(maxsize=8)
def _analysis_fn(model: VisionTransformer):
    """Jitted (params, images [B, H, W, C] or a NaFlex batch) -> (distance [B, L, H],
    rollout flow [B, n], the registers' share of the class token's attention [B, 2]: the
    last layer's mean over heads, the rollout's); the full attention [L, B, H, N, N] never
    leaves the device."""
    prefix, token = model.num_prefix, model.classifier == "token"
    registers = slice(prefix - model.registers, prefix)  # after the class token

    @jax.jit
    def analyse(params: Any, x: Any) -> tuple[jax.Array, jax.Array]:
        att, head = attention_of(model, params, x)  # [L, B, H, N, N], [B, H, 1, N] or None
        flex = naflex.is_naflex(x)
        grid = x if flex else model.grid(x.shape[1:3])
        distance = attention.mean_attention_distance(att, grid, model.token_stride, prefix)
        rollout = attention.attention_rollout(att)
        row = attention.flow(rollout, prefix, x["valid"] if flex else None, head, token)
        share = lambda a: a[:, 0, registers].sum(-1)  # [B]: row 0 over the registers
        shares = jnp.stack([share(att[-1].mean(1)), share(rollout)], axis=-1)
        return distance.transpose(1, 0, 2), row, shares  # batch first, for in_batches

    return analyse


def analyse_images(
    model: VisionTransformer, params: Any, images: Any, batch_size: int = 8
) -> tuple[np.ndarray, Any]:
    """Mean attention distance per image and head, and rollout maps, in batches.

    Returns:
      (distance [L, B, H] in pixels, rollout maps [B, gh, gw]; for a NaFlex batch a list
      of each image's [gh, gw]).
    """
    return _analysed(model, params, images, batch_size)[:2]


def _analysed(model: VisionTransformer, params: Any, images: Any, batch_size: int) -> tuple:
    """`analyse_images`' two, and the registers' shares (`_analysis_fn`) [B, 2]."""
    x = images if naflex.is_naflex(images) else np.asarray(images, np.float32)
    if len(jax.tree.leaves(x)[0]) == 0:
        raise ValueError("no images to inspect: images is empty (sample_images makes some)")
    fn = functools.partial(_analysis_fn(model), params)
    distance, rows, shares = in_batches(fn, batch_size, x)
    grid = x if naflex.is_naflex(x) else model.grid(x.shape[1:3])
    return distance.transpose(1, 0, 2), attention.on_grids(rows, grid), shares


def naflex_images(x: dict, patch_size: int) -> list[np.ndarray]:
    """The images of a NaFlex batch, each [gh * P, gw * P, C], to draw its maps over."""
    grids = attention.on_grids(np.swapaxes(x["patches"], 1, 2), x)  # [P*P*C, gh, gw] each
    p = patch_size
    tiles = [g.reshape(p, p, -1, *g.shape[1:]).transpose(3, 0, 4, 1, 2) for g in grids]
    return [t.reshape(t.shape[0] * p, t.shape[2] * p, -1) for t in tiles]  # [gh, P, gw, P, C]


def sample_images(
    num_images: int,
    image_size: tuple[int, int],
    data_dir: str | None = None,
    method: str = "tf_bilinear",
    seq_len: int | None = None,
    patch_size: int = 0,
) -> Any:
    """The first `num_images` test images of the idx dataset (Fashion-MNIST by default),
    through the evaluation preprocessing (vit_jax/data/pixels.py) by `method`; with
    `seq_len`, as a NaFlex batch of `patch_size` patches (vit_jax/data/naflex.py).

    Returns:
      images in [-1, 1].  # [num_images, H, W, 3], or NaFlex [num_images, seq_len, ...]
    """
    from vit_jax import data

    cfg = data.default_config()
    cfg.preprocessing = method
    if data_dir:
        cfg.data_dir = data_dir
    if seq_len:
        cfg.naflex.seq_lens = (seq_len,)
    cfg.test_split = f"test[:{num_images}]"
    with eval_batches(cfg, cfg.test_split, num_images, image_size, patch_size) as batches:
        batch = next(batches)
    return jax.tree.map(lambda x: x[batch["mask"] > 0], batch["image"])


def compute(
    model: VisionTransformer,
    params: Any,
    images: Any,
    num_components: int = filters.NUM_COMPONENTS,
    batch_size: int = 8,
) -> Inspection:
    """Filter PCA, position-embedding similarity, attention distance and rollout.

    Args:
      model: the model; `params` adapted to the images' size (`weights.adapt`).
      params: its parameters.
      images: inputs in [-1, 1] [B, H, W, C], or a NaFlex batch.
      num_components: principal components of the filters to keep.
      batch_size: images per forward pass.
    """
    flex = naflex.is_naflex(images)
    x = images if flex else np.asarray(images, np.float32)
    grids = naflex.grids(x) if flex else np.array([model.grid(x.shape[1:3])])  # [B or 1, 2]
    grid = (posemb.stored_grid(params, model) if flex else None) or tuple(grids[0].tolist())
    arrays, skipped = {}, {}
    try:
        pca = filters.filter_pca(filters.embedding_kernel(params, model), num_components)
        # filters_pca_components, _explained_variance and _variance_ratio
        arrays |= {f"filters_pca_{k}": v for k, v in vars(pca).items()}
    except filters.NotPixelFilters as e:
        skipped["filters"] = f"filters figure skipped: {e}"
    try:
        pe = posemb.patch_embeddings(params, model, grid)
        arrays["posemb_similarity"] = posemb.cosine_similarity_maps(pe, grid)
    except posemb.NoPositionEmbeddings as e:
        skipped["posemb"] = f"position-embedding figure skipped: {e}"
    distance, maps, shares = _analysed(model, params, x, batch_size)
    arrays["attention_distance"] = distance.mean(axis=1)  # [L, H]
    arrays["attention_distance_per_image"] = distance
    arrays["rollout"] = maps
    info = {
        "image_size": (grids * model.token_stride).tolist() if flex else list(x.shape[1:3]),
        "grid": grids.tolist() if flex else list(grid),
        "token_stride": model.token_stride,
        "hybrid": model.resnet_stages is not None,
        "class_token": model.has_class_token,
        "num_images": distance.shape[1],
        "attention_distance_pixels": np.round(
            arrays["attention_distance"].astype(float), 4
        ).tolist(),
        "attention_distance": "per head: attention of patch queries over patch keys "
        "(class token and registers dropped, rows renormalised) x euclidean distance between patch "
        "centres in input pixels, averaged over queries, then images",
        "rollout": "mean over heads, + identity, rows renormalised, multiplied over layers; "
        + ROWS.get(model.classifier, "the mean of the patch rows")
        + " over the patches",
    }
    if model.registers and model.has_class_token:  # not drawn: reported apart
        arrays["register_share"] = shares  # [B, 2]
        info["register_share"] = _register_share(shares, model.registers)
    return Inspection(arrays, info, skipped)


def _register_share(shares: np.ndarray, registers: int) -> dict[str, Any]:
    """inspect.json's summary of the registers' shares [B, 2] (`_analysis_fn`)."""
    last, rolled = np.round(shares.mean(0).astype(float), 4).tolist()
    return dict(
        last_layer=last,
        rollout=rolled,
        definition=f"the {registers} registers' share of the class token's attention (mean "
        "over heads) in the last layer and in the rollout, mean over images",
    )


def explain(
    result: Inspection,
    model: VisionTransformer,
    params: Any,
    images: Any,
    classes: Any = (),
    labels: Any = None,
    batch_size: int = 8,
) -> None:
    """Adds relevance maps to `result` for `classes` (head indices or, where `labels` name
    the head's classes, names), the same for every image; none: each image's prediction.

    Raises:
        ValueError: a class that is neither an index of the head nor one of `labels`.
    """
    logits = in_batches(functools.partial(predict.logits_fn(model), params), batch_size, images)
    probs = np.asarray(jax.nn.softmax(logits))  # [B, classes]
    wanted = [_class_index(c, model.num_classes, labels) for c in classes]
    chosen = np.array([wanted] * len(probs)) if wanted else probs.argmax(-1)[:, None]
    result.arrays["relevance"] = relevance(model, params, images, chosen, batch_size)
    result.arrays["relevance_classes"] = chosen
    result.arrays["relevance_probabilities"] = np.take_along_axis(probs, chosen, axis=1)
    result.info["relevance"] = (
        "Chefer et al. 2021: per layer mean over heads of (gradient "
        "of the class's logit x attention)+, R <- R + that R from I; "
        + result.info["rollout"].split("; ")[-1]
    )
    result.info["relevance_labels"] = labels


def _class_index(name: str, num_classes: int, labels: list[str] | None) -> int:
    if labels and name in labels:
        return labels.index(name)
    if name.lstrip("-").isdigit() and 0 <= int(name) < num_classes:
        return int(name)
    known = f"; or one of its class names: {', '.join(labels[:10])}..." if labels else ""
    raise ValueError(
        f"class {name!r}: expected an index of the head's {num_classes} classes "
        f"(0-{num_classes - 1}){known}"
    )


def write(
    result: Inspection, images: Any, out_dir: str, title: str, names: list[str] | None = None
) -> list[str]:
    """Saves inspect.npz, inspect.json and the PNGs to `out_dir`; returns the paths.

    `images` [B, H, W, C], or each image of a NaFlex batch (`naflex_images`), to draw over.

    `names` label the images (their file names) in the rollout figure and inspect.json.
    """
    out = store.path(out_dir)
    out.mkdir(parents=True, exist_ok=True)  # nothing to make on a store
    path = lambda name: str(out / name)
    a, written = result.arrays, []
    if "filters_pca_components" in a:
        tiles = filters.to_tiles(a["filters_pca_components"])
        plots.plot_filters(tiles, a["filters_pca_variance_ratio"], path(PNG["filters"]), title)
        written.append(path(PNG["filters"]))
    if "posemb_similarity" in a:
        plots.plot_posemb_similarity(a["posemb_similarity"], path(PNG["posemb"]), title)
        written.append(path(PNG["posemb"]))
    plots.plot_attention_distance(a["attention_distance"], path(PNG["distance"]), title)

    def upsample(maps: Any) -> list[np.ndarray]:  # of the images drawn (maybe fewer than computed)
        # [H, W] or [K, H, W] each: every image at its own size
        return [attention.upsample(m, np.shape(i)[:2]) for m, i in zip(maps, images, strict=False)]

    plots.plot_rollout(images, upsample(a["rollout"]), path(PNG["rollout"]), title, names)
    written += [path(PNG["distance"]), path(PNG["rollout"])]
    if "relevance" in a:
        up = upsample(a["relevance"])  # [K, H, W] each
        labels = result.info.get("relevance_labels")
        name = lambda c: labels[c] if labels else f"class {c}"
        chosen, probs = a["relevance_classes"], a["relevance_probabilities"]
        captions = [
            [f"{name(c)} ({p:.0%})" for c, p in zip(cs, ps, strict=True)]
            for cs, ps in zip(chosen, probs, strict=True)
        ]
        plots.plot_relevance(images, up, captions, path(PNG["relevance"]), title, names)
        written.append(path(PNG["relevance"]))
    flat = {}  # a NaFlex batch's maps, one per image: rollout/0, rollout/1, ...
    for k, v in a.items():
        flat.update({f"{k}/{i}": m for i, m in enumerate(v)} if isinstance(v, list) else {k: v})
    with files.atomic_write(path(NUMBERS)) as f:
        np.savez(f, **flat)
    summary = dict(result.info, title=title, images=names, skipped=result.skipped, files=written)
    with files.atomic_write(path(SUMMARY), "w") as f:
        json.dump(summary, f, indent=1)
    return written + [path(NUMBERS), path(SUMMARY)]
