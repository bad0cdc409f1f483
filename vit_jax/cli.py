"""What every command shares: flag parsing, quiet library logs, and user errors as one line.

A command module holds its flags, one call into the library and its printing, and ends
with `cli.run(main, define_flags)`. User errors (a missing file, a bad value or flag, a
config that does not fit, a non-finite run, a missing optional package) print `error: ...`
with the way out and exit 1, without a traceback (VIT_JAX_DEBUG=1 shows it); other
exceptions are bugs and keep theirs. Ctrl-C prints one line and exits 130; a training run
stopped by SIGTERM exits 143 (`vit_jax.training.stopping`). The last word of a command and
the libraries' reports held back until then are vit_jax/base/exits.py's.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

from absl import app, flags, logging

from vit_jax.base.exits import HeldErrors, debug, fail, interrupted

USER_ERRORS = (OSError, ValueError, FloatingPointError, ImportError)


def run(
    main: Callable[[], object],
    define_flags: Callable[[], None] | None = None,
    argv: Sequence[str] | None = None,
    prepare_argv: Callable[[list[str]], list[str]] | None = None,
) -> None:
    """Defines the command's flags, parses `argv` (default sys.argv) and calls `main()`.

    `prepare_argv` may rewrite the arguments before absl parses them (main.py turns
    preset names into config file paths); a ValueError it raises is a user error.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before anything imports TensorFlow
    argv = list(argv if argv is not None else sys.argv)
    if prepare_argv is not None:
        try:
            argv = prepare_argv(argv)
        except ValueError as e:
            fail(str(e))
    saved, sys.argv = sys.argv, argv  # config_flags reads --config.* overrides from sys.argv
    try:
        if define_flags is not None:
            _define_command_flags(define_flags, argv[0])
        _run_app(main, argv)
    finally:
        sys.argv = saved


def _run_app(main: Callable[[], object], argv: list[str]) -> None:
    started = []

    def entry(rest: list[str]) -> None:
        started.append(True)
        if len(rest) > 1:
            raise app.UsageError(f"unexpected arguments: {' '.join(rest[1:])}")
        if not flags.FLAGS["verbosity"].present:
            logging.set_verbosity(logging.WARNING)  # libraries' INFO logs drown the output
        held = HeldErrors()
        with held:
            try:
                main()
            except (*USER_ERRORS, KeyboardInterrupt) as e:
                if debug():
                    raise
                if isinstance(e, KeyboardInterrupt):
                    interrupted(str(e), getattr(e, "exit_status", 130))
                fail(in_flags(str(e)))
        held.release()  # the command succeeded: what libraries reported is shown after all

    try:
        app.run(entry, argv=argv, flags_parser=parse_flags)
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        if started or debug():  # raised by the command itself: not a parsing error
            raise
        # Raised while absl parsed the flags: ml_collections' config overrides
        # (--config.x.y=v) raise these for a field that does not exist or a bad value.
        fail(f"{_config_error(e, argv)} (every config field is in vit_jax/configs/common.py)")


def _config_error(error: Exception, argv: list[str]) -> str:
    """ml_collections' error for a --config.x.y=v override, as one sentence naming the flag
    and its suggestion: '--config.optimizer.lrr: no such config field; did you mean
    --config.optimizer.lr?'."""
    what = " ".join(str(error).replace("\\n", " ").replace("\\", "").replace("'", "").split())
    field = what.split()[0].strip('"') if what else ""
    given = [a.split("=")[0].split(".") for a in argv if a.startswith("--config.")]
    parts = next((f for f in given if field in f[1:]), None)  # the field may be any part
    if parts is None:
        return f"in the flags: no such config field, or a bad value: {what}"
    instead = ""
    if hint := re.search(r'Did you mean "(\w+)"', what):
        i = parts.index(field, 1)
        instead = f"; did you mean {'.'.join([*parts[:i], hint[1], *parts[i + 1 :]])}?"
    return f"{'.'.join(parts)}: no such config field{instead}"


def _define_command_flags(define_flags: Callable[[], None], program: str) -> None:
    """Runs `define_flags` and makes the vit_jax flags it defined (define_model_flags',
    which absl files under vit_jax.cli, not the command) key flags of the command, so
    that `--help` lists them all; `--helpfull` adds absl's and the libraries' own."""
    before = set(flags.FLAGS)
    define_flags()
    for name in sorted(set(flags.FLAGS) - before):
        if flags.FLAGS.find_module_defining_flag(name, "").startswith("vit_jax."):
            # --help describes the key flags of the module named sys.argv[0] (`program`).
            flags.FLAGS.register_key_flag_for_module(program, flags.FLAGS[name])


def command_name(program: str) -> str:
    """sys.argv[0] of a command -> 'vit_jax.infer' ('.../vit_jax/evaluate.py' ->
    'vit_jax.evaluate'); anything else as it is."""
    parts = os.path.normpath(program).split(os.sep)
    if program.endswith(".py") and "vit_jax" in parts:
        start = len(parts) - 1 - parts[::-1].index("vit_jax")
        parts = [*parts[start:-1], parts[-1].removesuffix(".py")]
        return ".".join(parts[:-1] if parts[-1] == "__main__" else parts)
    return program


def flag_error_message(error: BaseException, program: str) -> str:
    """One line for a flag parsing error, ending with where the flags are listed.

    A config file's own error (a preset argument that does not exist, raised by its
    get_config) arrives wrapped twice, with the file's traceback in the message: the
    original exception, at the end of the chain, says it alone.
    """
    root = error
    while root.__cause__ or root.__context__:
        root = root.__cause__ or root.__context__
    if root is not error and "Error whilst parsing config file" in str(error):
        return str(root)  # the config's own message names the valid arguments
    required = r"(?:flag --\S+=None: )?[Ff]lag --(\S+) must have a value other than None\."
    what = " ".join(re.sub(required, r"--\1 is required;", str(error)).split()).rstrip(";")
    return f"{what} (python -m {command_name(program)} --help lists the flags)"


def parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing (app.run's flags_parser) with its errors as `error: ...`, and
    `--help` (absl exits 1 after printing it) a success."""
    try:
        return flags.FLAGS(argv)
    except SystemExit as e:
        help_flags = ("help", "?", "helpshort", "helpfull", "helpxml")
        if e.code == 1 and any(a.lstrip("-").split("=")[0] in help_flags for a in argv[1:]):
            sys.exit(0)
        raise
    except flags.Error as e:
        if debug():
            raise
        fail(flag_error_message(e, argv[0]))


# The library's messages name its arguments; a command's user sets them with flags. One
# table says each in flags (the commands that load a checkpoint share these flags).
FLAGS_OF_ARGUMENTS = {
    "name=NAME": "--model=NAME", "num_heads=H": "--override=num_heads=H",
    "posemb='sincos_2d'": "--override=posemb=sincos_2d", "image_size=(H, W)": "--image_size=H,W",
    "num_classes=K": "--num_classes=K",
    **{f"format='{name}'": f"--format={name}" for name in ("npz", "onnx", "timm")},
    "paths=[PATH, ...]": "--image=PATH (repeat for more)", "out=DIR": "--out=DIR",
}  # fmt: skip


def in_flags(message: str) -> str:
    """A library message with the arguments it names said as the commands' flags."""
    for argument, flag in FLAGS_OF_ARGUMENTS.items():
        message = message.replace(argument, flag)
    return message


# ---------------------------------------------------------------- commands that load a checkpoint


SKIP_CORRUPT = (
    "Image folders: leave out files that do not decode (counted and logged), as "
    "dataset.skip_corrupt does in training; each file is decoded once up front."
)


def define_model_flags(naflex: bool = False) -> None:
    """--checkpoint, --model, --override, --image_size, --patch_size, --numerics and
    --preprocessing, shared by the commands that load a checkpoint (classify, few-shot,
    figures, evaluate, convert); with `naflex`, --seq_len too (the commands that apply the
    model: convert writes the weights alone, so it has no input shape to take)."""
    if naflex:
        flags.DEFINE_integer(
            "seq_len",
            None,
            "NaFlex: patches a row, each image at its own aspect ratio (resized to the most "
            "patches that fit). Default: square images at --image_size. Not for hybrids.",
            lower_bound=1,
        )
    flags.DEFINE_string(
        "checkpoint",
        None,
        "Checkpoint: a published .npz (or final.npz), a timm .safetensors "
        "file, a Hugging Face model directory, a published file's gs:// path, or a run's "
        "workdir (its newest checkpoint that verifies; LoRA's adapters unmerged).",
    )
    flags.DEFINE_string(
        "model",
        None,
        "Variant, e.g. ViT-B_16, B/16, R50+ViT-B_16; or timm's architecture of a bare "
        ".safetensors tower (vit_small_patch14_reg4_dinov2). Default: read from the file.",
    )
    flags.DEFINE_multi_string(
        "override", [], "Model option KEY=VALUE (e.g. posemb=sincos_2d, dtype=bfloat16); repeat."
    )
    flags.DEFINE_string("image_size", None, "Resolution N or H,W. Default: the checkpoint's own.")
    flags.DEFINE_integer(
        "patch_size",
        None,
        "Another patch size than the checkpoint's: its patch embedding is "
        "resampled (FlexiViT); the default resolution keeps the token grid.",
        lower_bound=1,
    )
    flags.DEFINE_enum(
        "numerics",
        "file",
        ["file", "original"],
        "GELU form and LayerNorm epsilon. file: what "
        "the checkpoint says (a published .npz: the original's; timm: exact GELU, eps 1e-6 "
        "unless this package wrote it; Hugging Face: config.json's). original: tanh GELU, eps "
        "1e-6, for files others converted from the published weights, such as google/vit-* on "
        "the hub (their config.json says gelu, 1e-12). --override=gelu=... sets one.",
    )
    flags.DEFINE_string(
        "preprocessing",
        None,
        "How images are resized and normalised: "
        "tf_bilinear (tf.image.resize, no antialiasing: the published checkpoints') or "
        "pil_antialias (PIL's antialiased bilinear: HF's and timm's), to [-1, 1]; in full "
        "RESIZE[:mean=R,G,B][:std=R,G,B][:crop=F][:mode=MODE], RESIZE tf_bilinear|"
        "pil_antialias|pil_bicubic, MODE squash|center|hf_center|border (docs/data.md). "
        "Default: what the checkpoint records (a published .npz: tf_bilinear; another "
        "tool's file: its own, else pil_antialias).",
    )
    flags.register_validator("preprocessing", _check_preprocessing)
    flags.mark_flag_as_required("checkpoint")


def _check_preprocessing(value: str | None) -> bool:
    """--preprocessing's check: a bad string is one line naming the part and the grammar."""
    from vit_jax.data.preprocessing import problem

    if value is not None and (why := problem(value)):
        raise flags.ValidationError(why)
    return True


def parse_overrides(items: Sequence[str]) -> dict[str, object]:
    """['depth=4', 'posemb=sincos_2d', 'resnet_stages=(3,4,9)'] -> {'depth': 4, ...}."""
    out: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--override={item}: expected KEY=VALUE, e.g. posemb=sincos_2d")
        try:
            out[key.strip()] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key.strip()] = value  # a plain string such as sincos_2d
    return out


def model_overrides() -> dict[str, object]:
    """--override's model options, with --numerics=original's (named overrides win)."""
    from vit_jax.models import ORIGINAL_NUMERICS, attention

    numerics = ORIGINAL_NUMERICS if flags.FLAGS.numerics == "original" else {}
    out = {**numerics, **parse_overrides(flags.FLAGS.override)}
    if "attention" in out:  # what this host cannot run, refused before anything is read
        attention.choose(out["attention"], 0, out.get("dtype", "float32"))
    return out


def load_model(head: bool = True):
    """The flags' checkpoint (a file, or a run's workdir: `outputs.load_run`), read once:
    `weights.Loaded`, its preprocessing --preprocessing's, else the checkpoint's."""
    from vit_jax import weights
    from vit_jax.data import images

    f, overrides = flags.FLAGS, model_overrides()
    if seq_len() and f.image_size:
        raise ValueError(
            f"--seq_len={f.seq_len} and --image_size={f.image_size} both set the input's "
            "shape: --seq_len keeps each image's aspect ratio, --image_size squares it; pass one"
        )
    size = images.parse_image_size(f.image_size)
    try:
        if is_run(f.checkpoint):
            from vit_jax.training import outputs

            loaded = outputs.load_run(f.checkpoint, size, head, **overrides)
        else:
            loaded = weights.load(f.checkpoint, f.model, size, head, f.patch_size, **overrides)
    except TypeError as e:  # an override that is no model option
        raise ValueError(f"--override: {e}") from None
    if seq_len() and loaded.model.resnet_stages is not None:
        raise ValueError(
            f"--seq_len={f.seq_len}: {f.checkpoint} is a hybrid (ResNet + ViT), whose tokens "
            "come from the ResNet's feature map of a whole image, not patches: drop --seq_len"
        )
    return dataclasses.replace(loaded, preprocessing=f.preprocessing or loaded.preprocessing)


def seq_len() -> int | None:
    """--seq_len where the command defines it, else None (square images)."""
    return flags.FLAGS["seq_len"].value if "seq_len" in flags.FLAGS else None


def naflex_note(loaded: Any) -> None:
    """Says on stderr (stdout is the command's results) what --seq_len does to the loaded
    model: which position table it resizes to each image's grid. Nothing without --seq_len
    or without a stored table."""
    n, model, path = seq_len(), loaded.model, flags.FLAGS.checkpoint
    if not n or model.posemb not in ("learned", "learned_2d"):
        return  # sincos_2d is made for each grid; none has nothing to resize
    gh, gw = model.grid(loaded.image_size)  # the grid the table was stored for
    name = path.rstrip("/").rsplit("/", 1)[-1]
    print(
        f"NaFlex at {n} patches: the {gh}x{gw} position embeddings of {name} are resized to "
        "each image's own grid",
        file=sys.stderr,
    )


def is_run(checkpoint: str) -> bool:
    """Whether --checkpoint names a run's workdir (it holds checkpoints/), not a file."""
    from vit_jax.base import store

    file = checkpoint.endswith((".npz", ".safetensors"))
    return not file and (store.path(checkpoint) / "checkpoints").is_dir()


def model_title(model_name: str | None, path: str, size: tuple[int, int]) -> str:
    """'ViT-B_16 (ViT-B_16.npz) at 384x384' ('... at NaFlex 256 patches' with --seq_len),
    for the commands' first line."""
    at = f"NaFlex {seq_len()} patches" if seq_len() else f"{size[0]}x{size[1]}"
    return f"{model_name or 'the model'} ({path}) at {at}"
