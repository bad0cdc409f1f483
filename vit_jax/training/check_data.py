"""The checks of a run config that read: the data it names (split boundaries, class ids,
few-shot shots against each class's examples) and its `init_from` file. Each reads,
none writes; `check.check` runs them after the config alone and the devices pass.
"""

from __future__ import annotations

from typing import Any

import ml_collections

from vit_jax.base import console, store
from vit_jax.base.problems import Problem


def data_problems(config: ml_collections.ConfigDict, init_from_later: bool = False) -> list:
    """The fields that do not fit the data they name, and an `init_from` that names no
    file (unless `init_from_later`: an earlier run writes it). Reads the datasets' sizes
    and labels (and the idx files), writes nothing."""
    from vit_jax.weights import remote

    c, out = config, []
    init_from = c.init_from
    hub = init_from.startswith(remote.HUB) if init_from else False  # resolved when loaded
    if init_from and not init_from_later and remote.url(init_from) is None and not hub:
        if not _exists(out, init_from):
            why = (
                "no such file or directory: name the checkpoint to fine-tune: a .npz (a "
                "published file, or the final.npz of a run: the fashion_mnist:pretrain "
                "preset writes WORKDIR/final.npz), a timm .safetensors file, a Hugging "
                "Face model directory, or a published file's gs:// path "
                "(vit_jax/weights/published_checkpoints.json); '' trains from scratch"
            )
            out.append(Problem("init_from", init_from, why))
    train = _open(out, c.dataset, "dataset.", c.dataset.train_split, "train_split")
    if train is not None and not len(train):
        why = "no examples left after slicing, dataset.classes and dataset.examples_per_class"
        out.append(Problem("dataset.train_split", c.dataset.train_split, why))
    _open(out, c.dataset, "dataset.", c.dataset.test_split, "test_split")
    if c.fewshot.datasets:
        out += _fewshot_data_problems(c)
    first = {}  # a data directory that fails both splits is one problem
    for p in out:
        first.setdefault(p.field, p)
    return list(first.values())


def _exists(out: list[Problem], path: str) -> bool:
    """Whether `path` (local, gs://, s3://) exists; a store that cannot be asked is a
    problem of its own (no credentials, no such bucket), named here."""
    try:
        return store.path(path).exists()
    except Exception as e:  # noqa: BLE001 (each store raises its own)
        out.append(Problem("init_from", path, f"cannot be read: {store.explain(e, path)}"))
        return True  # said above


def _open(out: list[Problem], cfg: Any, prefix: str, spec: str, field: str) -> Any:
    """The table of split `spec`, or None with the reason appended to `out`, named by
    the field it comes from."""
    from vit_jax.data import splits, subsets, tables

    try:
        return tables.open_table(cfg, spec)
    except splits.SplitError as e:
        out.append(Problem(f"{prefix}{field}", spec, str(e).removeprefix(f"split {spec!r}: ")))
    except subsets.ClassesError as e:
        out.append(Problem(f"{prefix}classes", cfg.classes, str(e)))
    except FileNotFoundError as e:
        out.append(Problem(f"{prefix}data_dir", cfg.data_dir, str(e)))
    except (ValueError, ImportError, OSError) as e:  # a TFDS name, an unreadable folder
        culprit = "name" if cfg.source == "tfds" else "data_dir"
        out.append(Problem(f"{prefix}{culprit}", cfg[culprit], str(e)))
    return None


def _fewshot_data_problems(c: ml_collections.ConfigDict) -> list[Problem]:
    """Each few-shot dataset opens, and each class of its train split has at least the
    largest number of shots."""
    import numpy as np

    from vit_jax.data import default_config
    from vit_jax.evaluation.fewshot import section_configs

    f, out = c.fewshot, []
    most = max(f.shots)
    for fields in section_configs(f):
        cfg = default_config()
        cfg.update(fields)
        cfg.examples_per_class, cfg.subset_seed = most, f.seed  # as FewShotEvaluator reads
        with console.absl_warnings_off():  # short classes are named below, not warned
            train = _open(out, cfg, "fewshot.", cfg.train_split, "train_split")
        _open(out, cfg, "fewshot.", cfg.test_split, "test_split")
        if train is None or train.labels is None:
            continue
        counts = np.bincount(train.labels, minlength=train.num_classes)
        short = [(k, int(n)) for k, n in enumerate(counts) if n < most]
        if short:
            k, n = short[0]
            more = f" (and {len(short) - 1} more classes)" if len(short) > 1 else ""
            why = (
                f"class {k} of {cfg.name} {cfg.train_split!r} has {n} example"
                f"{'s' if n != 1 else ''}{more}; the largest shot takes {most} of each class"
            )
            out.append(Problem("fewshot.shots", tuple(f.shots), why))
    return out
