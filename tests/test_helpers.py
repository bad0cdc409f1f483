"""The shared test helpers that compare: each mismatch they exist to catch fails them."""

import numpy as np
import pytest
from helpers import assert_npz_equal, assert_trees_equal, flat

KERNEL = np.arange(6, dtype=np.float32).reshape(2, 3)
TREE = {"a": {"kernel": KERNEL}, "b": np.float32(0.5)}
MISMATCHES = {
    "one ulp": {"a": {"kernel": np.nextafter(KERNEL, np.float32(10))}, "b": TREE["b"]},
    "dtype": {"a": {"kernel": KERNEL.astype(np.float64)}, "b": TREE["b"]},
    "shape": {"a": {"kernel": KERNEL.reshape(3, 2)}, "b": TREE["b"]},
    "broadcast": {"a": {"kernel": KERNEL[:1]}, "b": TREE["b"]},
    "missing key": {"a": {"kernel": KERNEL}},
    "flat, not nested": flat(TREE),
}


def test_trees_equal_holds_for_a_copy():
    assert_trees_equal({"a": {"kernel": KERNEL.copy()}, "b": np.float32(0.5)}, TREE)


@pytest.mark.parametrize("name", sorted(MISMATCHES))
def test_trees_equal_is_bit_for_bit(name):
    with pytest.raises(AssertionError):
        assert_trees_equal(MISMATCHES[name], TREE)


def test_trees_close_uses_an_absolute_tolerance_only():
    big = {"a": {"kernel": KERNEL + np.float32(1e-3)}, "b": TREE["b"]}
    assert_trees_equal(big, TREE, atol=2e-3)
    with pytest.raises(AssertionError):
        assert_trees_equal(big, TREE, atol=1e-4)
    far = {"a": {"kernel": KERNEL + np.float32(1e8)}, "b": TREE["b"]}
    shifted = {"a": {"kernel": far["a"]["kernel"] + np.float32(8)}, "b": TREE["b"]}
    np.testing.assert_allclose(shifted["a"]["kernel"], far["a"]["kernel"])  # rtol 1e-7: close
    with pytest.raises(AssertionError):  # but 8 apart, beyond atol 1
        assert_trees_equal(shifted, far, atol=1.0)
    with pytest.raises(AssertionError):  # a tolerance is no excuse for another dtype
        wide = big["a"]["kernel"].astype(np.float64)
        assert_trees_equal({"a": {"kernel": wide}, "b": TREE["b"]}, TREE, atol=1.0)


def test_npz_equal_compares_the_stored_names_and_bits(tmp_path):
    np.savez(tmp_path / "a.npz", **flat(TREE))
    np.savez(tmp_path / "same.npz", **flat(TREE))
    assert_npz_equal(tmp_path / "same.npz", tmp_path / "a.npz")
    kernel = KERNEL.copy()
    kernel[1, 2] = -kernel[1, 2]
    others = {
        "value": {"a/kernel": kernel, "b": TREE["b"]},
        "renamed": {"A/kernel": KERNEL, "b": TREE["b"]},
        "extra": {**flat(TREE), "c": np.zeros(1, np.float32)},
    }
    for name, arrays in others.items():
        np.savez(tmp_path / f"{name}.npz", **arrays)
        with pytest.raises(AssertionError):
            assert_npz_equal(tmp_path / f"{name}.npz", tmp_path / "a.npz")
