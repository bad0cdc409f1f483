"""Which JPEG decoder and which resize the input pipeline uses: the candidates, timed.

    python benchmarks/decoders.py                 # 300x400 and 375x500 JPEGs, one core
    python benchmarks/decoders.py --sizes=375x500 --images=128

Each candidate turns one JPEG's bytes into the 224x224 Inception crop the training
pipeline makes (a random window of 5-100% of the area, aspect 3/4-4/3), timed alone on
one pinned core: images/s, the best of --repeats passes over --images files. Decoders
that are not installed are listed as such; the pipeline needs only simplejpeg, OpenCV
and Pillow. Candidates:

  decode (whole file; the window is a view):
    pil            Pillow (its bundled libjpeg-turbo, accurate DCT)
    simplejpeg     simplejpeg, accurate DCT (= PIL's pixels) and integer-fast DCT
                   (= tf.io.decode_jpeg's pixels)
    opencv         cv2.imdecode
    imagecodecs    imagecodecs.jpeg8_decode (libjpeg-turbo 3)
  decode of the window only:
    pyvips         libvips, sequential access, crop: rows below the window are not decoded
    turbojpeg      PyTurboJPEG 1.x (the system's libturbojpeg): a lossless crop to the
                   MCU-aligned window, then its decode
  resize of the window to 224 (after a simplejpeg decode):
    pil_antialias  PIL crop + bilinear resize (antialiased, uint8)
    cv2_linear     cv2.resize INTER_LINEAR on float32 (= tf.image.resize)
    numpy_linear   the same formula as NumPy gathers and lerps

The column "= PIL" says whether the decoder's pixels equal Pillow's (max |difference|).
"""

from __future__ import annotations

import argparse
import io
import os
import time

import numpy as np


def make_jpegs(n: int, h: int, w: int, seed: int = 0) -> list[bytes]:
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        small = rng.integers(0, 256, (h // 10, w // 10, 3), np.uint8)
        buf = io.BytesIO()
        Image.fromarray(small).resize((w, h), Image.BILINEAR).save(buf, "JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def windows(n: int, h: int, w: int, seed: int = 1) -> list[tuple[int, int, int, int]]:
    from vit_jax.data import augment

    rng = np.random.default_rng(seed)
    return [augment.crop_window(h, w, rng.random(augment.DRAWS), 0.05) for _ in range(n)]


def decoders() -> dict[str, object]:
    """name -> bytes -> uint8 [h, w, 3], for the decoders that import."""
    from PIL import Image

    def pil(b):
        with Image.open(io.BytesIO(b)) as f:
            f.load()
            return np.asarray(f)

    out = {"pil": pil}
    try:
        import simplejpeg

        out["simplejpeg"] = simplejpeg.decode_jpeg
        out["simplejpeg_fastdct"] = lambda b: simplejpeg.decode_jpeg(b, fastdct=True)
    except ImportError:
        pass
    try:
        import cv2

        cv2.setNumThreads(1)
        flags = cv2.IMREAD_COLOR_RGB | cv2.IMREAD_IGNORE_ORIENTATION
        out["opencv"] = lambda b: cv2.imdecode(np.frombuffer(b, np.uint8), flags)
    except (ImportError, AttributeError):
        pass
    try:
        import imagecodecs

        out["imagecodecs"] = imagecodecs.jpeg8_decode
    except ImportError:
        pass
    return out


def window_decoders(h: int, w: int) -> dict[str, object]:
    """name -> (bytes, window) -> uint8 crop, for the window decoders that import."""
    out = {}
    try:
        import pyvips

        pyvips.cache_set_max(0)

        def vips(b, win):
            y, x, ch, cw = win
            image = pyvips.Image.new_from_buffer(b, "", access="sequential")
            return image.crop(x, y, cw, ch).numpy()

        out["pyvips"] = vips
    except (ImportError, OSError):
        pass
    try:
        import turbojpeg

        tj = turbojpeg.TurboJPEG()

        def turbo(b, win):
            y, x, ch, cw = win
            x0, y0 = x // 16 * 16, y // 16 * 16  # the MCU grid of 4:2:0
            crop = tj.crop(b, x0, y0, min(w - x0, x + cw - x0), min(h - y0, y + ch - y0))
            return tj.decode(crop, pixel_format=turbojpeg.TJPF_RGB)

        out["turbojpeg"] = turbo
    except (ImportError, OSError, RuntimeError):  # no libturbojpeg, or another version
        pass
    return out


def numpy_linear(x: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    def taps(n, m):
        src = (np.arange(m) + 0.5) * (n / m) - 0.5
        lo = np.floor(src)
        f = (src - lo).astype(np.float32)
        return np.maximum(lo, 0).astype(np.intp), np.minimum(np.ceil(src), n - 1).astype(np.intp), f

    (ly, hy, fy), (lx, hx, fx) = taps(x.shape[0], size[0]), taps(x.shape[1], size[1])
    a, b = x[ly].astype(np.float32), x[hy].astype(np.float32)
    r = a + (b - a) * fy[:, None, None]
    return r[:, lx] + (r[:, hx] - r[:, lx]) * fx[None, :, None]


def resizers() -> dict[str, object]:
    """name -> (uint8 image, window) -> 224 x 224 crop."""
    import cv2
    from PIL import Image

    def pil(x, win):
        y, x0, ch, cw = win
        return np.asarray(Image.fromarray(x).crop((x0, y, x0 + cw, y + ch)).resize((224, 224)))

    def cv(x, win):
        y, x0, ch, cw = win
        crop = x[y : y + ch, x0 : x0 + cw].astype(np.float32)
        return cv2.resize(crop, (224, 224), interpolation=cv2.INTER_LINEAR)

    def npl(x, win):
        y, x0, ch, cw = win
        return numpy_linear(x[y : y + ch, x0 : x0 + cw], (224, 224))

    return {"pil_antialias": pil, "cv2_linear": cv, "numpy_linear": npl}


def rate(fn, items, repeats: int) -> float:
    for item in items[:4]:
        fn(*item)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for item in items:
            fn(*item)
        best = min(best, time.perf_counter() - start)
    return len(items) / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="300x400,375x500", help="JPEG sizes HxW")
    parser.add_argument("--images", type=int, default=64, help="JPEGs per size")
    parser.add_argument("--repeats", type=int, default=5, help="passes (the best counts)")
    args = parser.parse_args()
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    for size in args.sizes.split(","):
        h, w = (int(v) for v in size.split("x"))
        files, wins = make_jpegs(args.images, h, w), windows(args.images, h, w)
        print(f"\n{h}x{w} JPEGs (quality 90, 4:2:0), {args.images} files, one core")
        print(f"{'candidate':<34} {'images/s':>9}  = PIL")
        ref = [decoders()["pil"](b) for b in files]
        for name, fn in decoders().items():
            ips = rate(lambda b, fn=fn: fn(b), [(b,) for b in files], args.repeats)
            pairs = zip(files, ref, strict=True)
            diff = max(int(np.abs(fn(b).astype(int) - r).max()) for b, r in pairs)
            print(f"{'decode ' + name:<34} {ips:>9.0f}  {diff}")
        for name, fn in window_decoders(h, w).items():
            ips = rate(fn, list(zip(files, wins, strict=True)), args.repeats)
            print(f"{'decode window ' + name:<34} {ips:>9.0f}  -")
        import simplejpeg

        decoded = [simplejpeg.decode_jpeg(b) for b in files]
        for name, fn in resizers().items():
            ips = rate(fn, list(zip(decoded, wins, strict=True)), args.repeats)
            print(f"{'resize window ' + name:<34} {ips:>9.0f}")
        import cv2

        def chain(b, win, dct):
            y, x, ch, cw = win
            crop = simplejpeg.decode_jpeg(b, fastdct=dct)[y : y + ch, x : x + cw]
            return cv2.resize(crop.astype(np.float32), (224, 224))

        items = list(zip(files, wins, strict=True))
        for dct in (False, True):
            ips = rate(lambda b, win, d=dct: chain(b, win, d), items, args.repeats)
            label = f"simplejpeg{'_fastdct' if dct else ''} + cv2_linear"
            print(f"{label:<34} {ips:>9.0f}")


if __name__ == "__main__":
    main()
