"""TFDS image-classification datasets as random-access tables, without TensorFlow.

`tfds.data_source` reads a dataset prepared in the ArrayRecord format by index, so a
TFDS split is a table like the idx and folder sources: any permutation of it can be
drawn from a seed, and each process reads only its share. Images come out of the
records encoded and are decoded by `pixels.decode`, as image files are.

A dataset prepared in the TFRecord format (TFDS's default) is not random access: the
error says how to prepare it as ArrayRecord. Class subsets and per-class budgets need
the labels of the split: they are read once per process (image bytes not decoded).
"""

from __future__ import annotations

import difflib
import functools

import numpy as np
import tensorflow_datasets as tfds

from vit_jax.base import console


def _name(builder) -> str:
    config = builder.builder_config
    return builder.name if config is None else f"{builder.name}/{config.name}"


def prepare_command(builder) -> str:
    """The `tfds build` line that prepares `builder`'s dataset where this builder reads it.

    `--data_dir` is the root (TFDS adds <name>/<version> below it), `builder.data_dir_root`.
    """
    root = str(builder.data_dir_root)
    return f"tfds build {_name(builder)} --data_dir={root} --file_format=array_record"


@functools.lru_cache(maxsize=16)
def open_builder(name: str, data_dir: str | None):
    """tfds.builder(name, data_dir) of a prepared ArrayRecord dataset, or an error that
    lists close names or says how to prepare it."""
    try:  # a registered builder, or a prepared dataset found in data_dir by its files
        with console.absl_warnings_off():  # TFDS warns of each unprepared version folder
            builder = tfds.builder(name, data_dir=data_dir)  # it looks in: said below
            prepared = builder.is_prepared()
    except tfds.core.registered.DatasetNotFoundError:
        base = name.split("/")[0].split(":")[0]
        known = tfds.list_builders(with_community_datasets=False)
        close = difflib.get_close_matches(base, known, n=5, cutoff=0.5)
        raise ValueError(
            f"dataset.name={name!r} is not a TFDS builder nor a dataset prepared in "
            f"{data_dir or 'the TFDS data_dir'} (close matches: {close}). Expected an "
            "image-classification builder with 'image' and 'label' features, e.g. cifar10, "
            "cifar100, imagenet2012, oxford_iiit_pet, oxford_flowers102, fashion_mnist."
        ) from None
    if not prepared:
        root = str(builder.data_dir_root)
        raise FileNotFoundError(
            f"TFDS dataset {builder.name!r} is not prepared in {builder.data_dir}. "
            f"Prepare it with `{prepare_command(builder)}` (in Python: "
            f"`tfds.builder({_name(builder)!r}, data_dir={root!r}, file_format='array_record')"
            f".download_and_prepare()`); imagenet2012 and imagenet21k need their archives in "
            f"{root}/downloads/manual first."
        )
    features = builder.info.features
    if "image" not in features or "label" not in features:
        raise ValueError(
            f"TFDS builder {name!r} has features {list(features)}; the pipeline needs "
            "'image' and 'label' (an image-classification dataset)."
        )
    file_format = getattr(builder.info.file_format, "value", builder.info.file_format)
    if file_format != "array_record":
        raise ValueError(
            f"TFDS dataset {builder.name!r} in {builder.data_dir} is prepared as {file_format}, "
            "which has no random access; the input pipeline reads ArrayRecord. Prepare it "
            f"again with `{prepare_command(builder)}`, into another dataset.data_dir or after "
            f"removing {builder.data_dir} (TensorFlow is not needed to read it then)."
        )
    return builder


def split_size(builder, name: str) -> int:
    """Number of examples of split `name`."""
    infos = builder.info.splits
    if name not in infos:
        raise ValueError(
            f"TFDS dataset {builder.name!r} has no split {name!r}; its splits are {list(infos)}."
        )
    return int(infos[name].num_examples)


def num_classes(builder) -> int:
    return int(builder.info.features["label"].num_classes)


def class_names(builder) -> list[str] | None:
    """The label feature's class names (None where it has none)."""
    names = list(getattr(builder.info.features["label"], "names", None) or [])
    return names if len(names) == num_classes(builder) else None


@functools.lru_cache(maxsize=16)
def records(builder, name: str):
    """Random-access records of split `name`: [i] -> {'image': encoded bytes, 'label': int}."""
    return builder.as_data_source(split=name, decoders={"image": tfds.decode.SkipDecoding()})


@functools.lru_cache(maxsize=16)
def labels(builder, name: str) -> np.ndarray:
    """All labels of split `name` in storage order.  # int64 [N]"""
    source, out = records(builder, name), []
    for lo in range(0, len(source), 4096):  # __getitems__ reads a chunk at once
        chunk = source.__getitems__(list(range(lo, min(lo + 4096, len(source)))))
        out += [int(record["label"]) for record in chunk]
    return np.asarray(out, np.int64)
