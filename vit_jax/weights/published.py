"""The published ViT checkpoints: name, pretraining data, resolution, where the file
lives, and the fine-tuned accuracy reported for it (vit_jax/weights/published_checkpoints.json).

`--checkpoint` and `init_from` take a `path` from this table directly when the machine
has network access (the file is fetched once into the cache, see formats/remote.py);
offline they fail at once with a message saying so.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

TABLE = Path(__file__).with_name("published_checkpoints.json")


@lru_cache(maxsize=1)
def _load() -> dict[str, Any]:
    return json.loads(TABLE.read_text())


def checkpoints() -> list[dict[str, Any]]:
    """Every published checkpoint: {'name', 'pretraining', 'fine_tuned_on',
    'resolution', 'path', 'accuracy'} (accuracy in percent, None for pretraining files)."""
    return [dict(c) for c in _load()["checkpoints"]]


def markdown() -> str:
    """The table as Markdown (the README's copy)."""
    lines = [
        "| model | pretraining | fine-tuned on | resolution | file | top-1 (%) |",
        "| --- | --- | --- | ---: | --- | ---: |",
    ]
    for c in checkpoints():
        acc = "-" if c["accuracy"] is None else f"{c['accuracy']:.2f}"
        lines.append(
            f"| {c['name']} | {c['pretraining']} | {c['fine_tuned_on'] or '-'} | "
            f"{c['resolution']} | `{c['path']}` | {acc} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown())
