"""What a run leaves for use outside it: its newest checkpoint that verifies, loaded as a
model for inference (`load_run`: the commands' `--checkpoint=WORKDIR`), and its parameters
in the published layout (`merged_params`, LoRA's adapters merged) written as
`final.npz` (`export_npz`)."""

from __future__ import annotations

import functools
from typing import Any

import jax
import ml_collections

from vit_jax.base import exits, store
from vit_jax.models import lora
from vit_jax.parallel import distributed
from vit_jax.training.state import TrainState, build_model
from vit_jax.weights.adapt import adapt
from vit_jax.weights.load import Loaded, load_pretrained
from vit_jax.weights.meta import Meta
from vit_jax.weights.npz import save_npz
from vit_jax.workdir import verify
from vit_jax.workdir.checkpoints import WAY_OUT, Checkpoints
from vit_jax.workdir.record import read_record
from vit_jax.workdir.workdir import Workdir


def load_run(workdir: str, image_size: Any = None, head: bool = True, **overrides: Any) -> Loaded:
    """A run's newest checkpoint that verifies, as a model ready for inference: the model
    and resolution its record describes (with an empty model name, init_from's architecture
    as recorded; any `overrides` and `image_size` on top), a LoRA run's adapters unmerged
    over its base (init_from, read again). Nothing is changed.

    Raises:
        FileNotFoundError: no checkpoint there verifies, or the newest that does has no
            record of its model.
    """
    checkpoints = Checkpoints(Workdir.at(workdir).checkpoints, read_only=True)
    verdicts = (verify.check(checkpoints, s) for s in reversed(checkpoints.steps()))
    if (found := next((v for v in verdicts if not v.problems), None)) is None:
        raise FileNotFoundError(
            f"{workdir}: no checkpoint there verifies (python -m "
            f"vit_jax.checkpoints verify {workdir} lists them)"
        )
    record = read_record(checkpoints.directory / str(found.step), checkpoints.store) or {}
    if "model" not in (about := record.get("state") or {}):
        raise FileNotFoundError(
            f"{workdir}: checkpoint {found.step} verifies, but has no integrity record to say "
            "which model it holds (written before records were, or the record was removed): "
            "resume the run with its config (its next checkpoint writes one), or load its "
            "final.npz"
        )
    params, adapters = found.state["params"], about.get("lora")
    classes = params["head"]["kernel"].shape[-1] if head else None
    config = ml_collections.ConfigDict(about["model"])
    told = about.get("architecture")  # init_from's, where the model name is empty
    model = build_model(config, classes, told, ml_collections.ConfigDict(adapters or {}))
    if adapters:
        plain = model.clone(lora=None, num_classes=None)
        base = load_pretrained(
            adapters["init_from"], plain, about["image_size"], patch_size=config.get("patch_size")
        )
        params = lora.overlay(base, params)
    model = model.clone(**overrides)
    size = image_size or about["image_size"]
    size = (size, size) if isinstance(size, int) else tuple(size)
    params = adapt(params if head else {**params, "head": {}}, model, size, False, workdir)
    return Loaded(model, params, size, None, about.get("preprocessing", "tf_bilinear"))


def merged_params(state: TrainState, adapters: lora.Lora | None) -> Any:
    """The model's parameters in the published layout: LoRA's adapters merged."""
    if adapters is None:
        return state.model_params
    return jax.jit(functools.partial(lora.merge, lora=adapters))(state.model_params)


def export_npz(
    path: Any, params: Any, meta: Meta, checkpoints: Checkpoints, via: store.Store = store.PLAIN
) -> None:
    """`params` (sharded, possibly over several processes) -> a published-layout .npz with
    `meta`, written by process 0 (`via` the workdir's store); every process must call it
    (the arrays are gathered).

    Raises:
        OSError: the file could not be written, with the newest intact checkpoint and the
            way out (nothing half-written is left).
    """
    exits.unless_leaving()
    host = distributed.to_host(params)
    if not distributed.is_lead():
        return
    try:
        save_npz(path, host, meta, via)
    except Exception as e:  # noqa: BLE001 (OSError on a disk; a store raises its own)
        raise OSError(
            f"could not write {path}: {store.explain(e, path)}. Nothing half-written was "
            f"left. {checkpoints.newest_intact_sentence()}: {WAY_OUT}, which writes it "
            "without training again"
        ) from e
