"""A stand-in for torchvision, for the tests only: just enough for `import timm`.

timm imports torchvision at start-up (FrozenBatchNorm2d, transforms, datasets), but
the registry has no torchvision build that loads against the CPU torch the tests use.
A ViT's forward pass touches none of it. This package is put on the path only where a
real torchvision does not import (tests/test_formats.py); every name it serves is a
placeholder that fails loudly when called, so nothing can pass by using it.
"""

import enum
import sys
import types

__version__ = "0.0.0+stub"


class _Placeholder:
    """Any torchvision class timm names at import time (some it subclasses)."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError(f"{type(self).__name__} is a stub (tests/stubs/torchvision)")


class InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


def _module(name: str) -> types.ModuleType:
    """A submodule whose every other attribute is a new placeholder class."""
    module = types.ModuleType(name)

    def getattr_(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        cls = type(attr, (_Placeholder,), {"__module__": name})
        setattr(module, attr, cls)
        return cls

    module.__getattr__ = getattr_
    module.__path__ = []  # a package, so that submodules import
    sys.modules[name] = module
    return module


for _name in (
    "datasets",
    "io",
    "models",
    "models.feature_extraction",
    "ops",
    "ops.misc",
    "transforms",
    "transforms.functional",
    "transforms.v2",
    "utils",
):
    _m = _module(f"{__name__}.{_name}")
    _parent, _, _leaf = f"{__name__}.{_name}".rpartition(".")
    setattr(sys.modules[_parent], _leaf, _m)
sys.modules[f"{__name__}.transforms.functional"].InterpolationMode = InterpolationMode
sys.modules[f"{__name__}.transforms"].InterpolationMode = InterpolationMode
