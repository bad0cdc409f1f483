"""The crop decoder (vit_jax/data/_crop_decode.c, crop_decode.py) fed broken files: truncated,
bit-flipped and header-mangled JPEGs, each with windows at every edge and past them, through
`decode_crop` and through the C module directly. No crash, a result always of the window's
shape, every refusal a ValueError (the module's, libjpeg's, or pixels.decode's for the whole
file). Seeded: the same files and windows every run. docs/data.md says how to run it under
AddressSanitizer; VIT_JAX_FUZZ_ROUNDS=n runs n rounds of other seeds."""

from __future__ import annotations

import os

import numpy as np
import pytest
from test_crop_decode import JPEGS, edge_windows, jpeg, sliced  # skips without the module

from vit_jax.data import crop_decode, pixels

ROUNDS = int(os.environ.get("VIT_JAX_FUZZ_ROUNDS", "1"))
BIG = 2**22  # pixels: a mangled header claiming more is fed to the C module alone (below)
FILES = [dict(spec) for spec in JPEGS.values()]
FILES += [dict(h=26, w=19, orientation=6, subsampling=2), dict(h=33, w=40, quality=20)]
FILES += [
    dict(h=72, w=90, subsampling=2, restart_marker_rows=1),
    dict(h=70, w=50, progressive=True),
]


def segments(data: bytes) -> list[tuple[int, int, int]]:
    """(offset, marker, length) of each marker segment before the first scan's data."""
    out, i = [], 2
    while i + 4 <= len(data) and data[i] == 0xFF:
        marker, length = data[i + 1], int.from_bytes(data[i + 2 : i + 4], "big")
        out.append((i, marker, length))
        if marker == 0xDA:
            break
        i += 2 + length
    return out


def mangled(data: bytes, rng) -> bytes:
    """One header segment broken: its length, its bytes, dropped or doubled; an SOF's size,
    component count or sampling factors set to edge values."""
    offset, marker, length = segments(data)[rng.integers(len(segments(data)))]
    out, body = bytearray(data), offset + 4
    kind = rng.integers(6)
    if kind == 0:
        value = int(rng.choice([0, 1, 2, 3, length - 1, length + 1, 0xFFFF, rng.integers(65536)]))
        out[offset + 2 : offset + 4] = value.to_bytes(2, "big")
    elif kind == 1 and length > 2:
        for _ in range(int(rng.integers(1, 4))):
            out[body + int(rng.integers(length - 2))] = int(rng.integers(256))
    elif kind == 2:
        del out[offset : offset + 2 + length]
    elif kind == 3:
        out[offset:offset] = data[offset : offset + 2 + length]
    elif marker in (0xC0, 0xC1, 0xC2) and length >= 8:  # SOF: precision, height, width, n
        sides = [0, 1, 2, 7, 8, 9, 15, 16, 17, 255, 256, 0x7FFF, 0xFFFF]
        field = int(rng.integers(3))
        if field < 2:
            out[body + 1 + 2 * field : body + 3 + 2 * field] = int(rng.choice(sides)).to_bytes(
                2, "big"
            )
        elif kind == 4:
            out[body + 5] = int(rng.integers(6))  # components
        elif length >= 11:
            out[body + 7] = int(rng.integers(256))  # the first component's sampling factors
    else:
        out[offset + 1] = int(rng.choice([0xC0, 0xC1, 0xC2, 0xC3, 0xC4, 0xDB, 0xDD, 0xDA]))
    return bytes(out)


def mutants(data: bytes, rng, n: int):
    """`data` cut short at edges and at random, `n` with bits flipped (half of them in the
    header), and `n` with a header segment mangled."""
    header = segments(data)[-1][0] + 2 + segments(data)[-1][2]
    cuts = [0, 1, 2, 3, 4, header - 1, header, header + 1, len(data) - 2, len(data) - 1]
    cuts += [int(c) for c in rng.integers(5, len(data), n)]
    yield from (data[:c] for c in cuts)
    for i in range(n):
        out = bytearray(data)
        for _ in range(int(rng.integers(1, 5))):
            at = int(rng.integers(2, header if i % 2 else len(data)))
            out[at] ^= 1 << int(rng.integers(8))
        yield bytes(out)
    yield from (mangled(data, rng) for _ in range(n))


def windows(h: int, w: int, rng) -> list[tuple[int, int, int, int]]:
    """Every edge and corner inside the h x w image, and just past each edge."""
    past = [(h, 0, 1, 1), (0, w, 1, 1), (0, 0, h + 1, w), (0, 0, h, w + 1), (h - 1, w - 1, 2, 2)]
    past += [(-1, 0, 1, 1), (0, -1, 1, 1), (0, 0, 0, 1), (2**31 - 1, 0, 1, 1), (0, 0, 2**31, 2)]
    return edge_windows(h, w, rng, n=3) + past


def claimed(data: bytes) -> int:
    """The pixels the first SOF says the image has (0 if none)."""
    for offset, marker, length in segments(data):
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC) and length >= 7:
            body = data[offset + 5 : offset + 9]
            return int.from_bytes(body[:2], "big") * int.from_bytes(body[2:], "big")
    return 0


def check(data: bytes, box, fast: bool, counts: dict, whole: bool) -> None:
    """One window of one file through the module, and through decode_crop when `whole`."""
    try:
        raw = crop_decode.native().decode(data, *box, fast)
    except ValueError:
        counts["refused"] += 1
    else:
        assert len(raw) == box[2] * box[3] * 3, box
        counts["decoded"] += 1
    if whole:
        try:
            image = crop_decode.decode_crop(data, box, "tf_bilinear" if fast else "pil_antialias")
        except ValueError:
            return
        assert image.dtype == np.uint8 and image.shape == (box[2], box[3], 3), box


@pytest.mark.slow
@pytest.mark.parametrize("round_", range(ROUNDS))
def test_broken_files_and_edge_windows_never_crash(round_):
    """About 8,000 broken files, each with 25 windows: 200,000 calls (20 s)."""
    counts = {"decoded": 0, "refused": 0}
    for i, spec in enumerate(FILES):
        rng = np.random.default_rng([round_, i])
        data = jpeg(**spec, seed=i)
        h, w = spec["h"], spec["w"]
        h, w = (w, h) if spec.get("orientation", 1) >= 5 else (h, w)
        for k, bad in enumerate(mutants(data, rng, 250)):
            whole = claimed(bad) <= BIG and k % 3 == 0
            for j, box in enumerate(windows(h, w, rng)):
                check(bad, box, bool((j + k) % 2), counts, whole and j % 4 == 0)
    assert min(counts.values()) > 10_000, counts  # the files reach the decoder, and fail there


@pytest.mark.parametrize("orientation", [9, 61])
def test_an_exif_orientation_outside_1_to_8_turns_nothing(orientation):
    """Found by the fuzz test (a bit flipped in the EXIF): pixels.decode leaves such a file
    as stored, and so must its window, not taken for a transposed one."""
    data = jpeg(26, 19, orientation=orientation, subsampling=0, quality=95)
    whole = pixels.decode(data, "tf_bilinear")
    assert whole.shape == (26, 19, 3)
    for box in edge_windows(26, 19, np.random.default_rng(orientation)):
        np.testing.assert_array_equal(crop_decode.decode_crop(data, box), sliced(whole, box))


def test_a_jpeg_simplejpeg_has_no_name_for_is_refused_with_a_value_error():
    """Found by the fuzz test (a bit flipped in an SOF): first-component sampling factors
    1x4 (4:4:1), which simplejpeg's header reader fails on with a KeyError."""
    data = bytearray(jpeg(41, 27, subsampling=0))
    sof = next(offset for offset, marker, _ in segments(bytes(data)) if marker == 0xC0)
    data[sof + 11] = 0x14  # the first component's sampling factors: 1 across, 4 down
    for decode in (lambda d, _: pixels.decode(d, "tf_bilinear"), crop_decode.decode_crop):
        try:
            image = decode(bytes(data), (0, 0, 41, 27))
        except ValueError:
            continue
        assert image.shape == (41, 27, 3)
