"""Fields every run config has, with their defaults. The other config files start here.

Every field can be overridden from the command line (`--config.optimizer.lr=0.01`);
a field that does not exist is an error.
"""

from __future__ import annotations

import dataclasses

import ml_collections
from ml_collections import config_dict

from vit_jax import data
from vit_jax.evaluation.fewshot import DEFAULT_L2, DEFAULT_SHOTS

# The short names of the paper presets ('b16' in --config=finetune:b16,cifar10).
MODELS = {
    "ti16": "ViT-Ti_16", "s16": "ViT-S_16", "s32": "ViT-S_32", "b8": "ViT-B_8",
    "b16": "ViT-B_16", "b32": "ViT-B_32", "l16": "ViT-L_16", "l32": "ViT-L_32",
    "h14": "ViT-H_14", "r_ti16": "R+ViT-Ti_16", "r26_s32": "R26+ViT-S_32",
    "r26_b32": "R26+ViT-B_32", "r50_b16": "R50+ViT-B_16", "r50_l32": "R50+ViT-L_32",
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class TfdsData:
    """A TFDS dataset of a paper preset: builder name, splits, and the preset's steps."""

    name: str
    train_split: str
    test_split: str
    steps: int = 0

    def apply(self, c: ml_collections.ConfigDict) -> None:
        c.dataset.update(
            source="tfds", name=self.name, train_split=self.train_split, test_split=self.test_split
        )


def parse_model_dataset(preset: str, arg: str, datasets: dict) -> tuple[str, TfdsData]:
    """'b16,cifar10' -> ('ViT-B_16', datasets['cifar10']); errors list the choices."""
    model, _, dataset = arg.partition(",")
    if model not in MODELS or dataset not in datasets:
        raise ValueError(
            f"--config={preset}:{arg}: expected MODEL,DATASET with MODEL in "
            f"{sorted(MODELS)} and DATASET in {sorted(datasets)}"
        )
    return MODELS[model], datasets[dataset]


def model_fields(model: str) -> ml_collections.ConfigDict:
    """config.model: `name` is a published name ('ViT-B_16') or SIZE/PATCH ('B/16'), or ''
    for init_from's whole architecture (a tower's: training/state.build_model); the
    other fields are VisionTransformer options. None keeps the variant's own value; for
    `gelu` and `layer_norm_eps`, None is the init_from file's (its source's numerics, see
    vit_jax/weights/meta.py), or the original ViT's (tanh, 1e-6) from scratch."""
    unset = config_dict.placeholder  # a new reference each call: fields set one by one
    return ml_collections.ConfigDict(
        dict(
            name=model,
            representation_size=unset(int),
            classifier="token",
            posemb="learned",
            dropout=0.0,
            attention_dropout=0.0,
            stochastic_depth=0.0,
            dtype="float32",
            remat=False,
            scan=False,
            width=unset(int),
            depth=unset(int),
            num_heads=unset(int),
            mlp_dim=unset(int),
            patch_size=unset(int),
            gelu=unset(str),
            layer_norm_eps=unset(float),
            attention="auto",
        )
    )


def optimizer_fields() -> ml_collections.ConfigDict:
    """config.optimizer: the paper's fine-tuning SGD by default (vit_jax/training/state.py)."""
    return ml_collections.ConfigDict(
        dict(
            name="sgd",
            lr=0.03,
            end_lr=0.0,
            warmup_steps=500,
            decay="cosine",
            momentum=0.9,
            b1=0.9,
            b2=0.999,
            weight_decay=0.0,
            grad_clip=1.0,
            mu_dtype="",
            layer_decay=0.0,  # layer-wise lr decay, e.g. 0.75 (0: off; training/layer_decay.py)
        )
    )


def fewshot_fields() -> ml_collections.ConfigDict:
    """config.fewshot: linear few-shot accuracy of the frozen pre-logits on a cadence
    (pretraining runs; vit_jax/evaluation/fewshot.py): dataset names, comma-separated
    ('fashion_mnist' reads the idx files, any other name TFDS, unless `source` says
    otherwise); '' turns it off. `every` 0 runs it with each evaluation (eval_every)."""
    return ml_collections.ConfigDict(
        dict(
            datasets="",
            source="",
            data_dir="",
            train_split="train",
            test_split="test",
            shots=DEFAULT_SHOTS,
            l2=DEFAULT_L2,
            seed=0,
            batch_size=256,
            every=0,
        )
    )


def base(model: str) -> ml_collections.ConfigDict:
    """Every field of a run config, with its default: the presets change a few."""
    c = ml_collections.ConfigDict()
    c.seed = 0
    # '' trains from scratch; a checkpoint (published .npz, a final.npz of an earlier run,
    # timm or HF) is loaded with weights.load_pretrained: position embeddings resized
    # to image_size, pre_logits dropped unless model.representation_size is set, new zero
    # head if reset_head. An interrupted run resumes from its workdir whatever this says.
    c.init_from = ""
    c.reset_head = True
    # Low-rank adaptation of init_from (vit_jax/models/lora.py): rank 0 is off; with a rank
    # only the adapters (on `targets`: query, key, value, out, mlp) and the head train.
    # alpha 0 is the rank (scale 1). final.npz holds the merged model.
    c.lora = ml_collections.ConfigDict(dict(rank=0, alpha=0.0, targets="query,value"))
    c.model = model_fields(model)
    c.dataset = data.default_config()
    c.image_size = 384
    c.batch_size = 512  # global, over all devices and processes
    c.eval_batch_size = 512
    c.accum_steps = 1  # gradient accumulation: micro-batches of batch_size / accum_steps
    c.total_steps = 10_000
    # 'softmax_xent', or 'sigmoid_xent' (one binary cross-entropy per class, as the AugReg
    # presets pretrain; set model.head_bias_init to about -log(classes) with it).
    c.loss = "softmax_xent"
    c.optimizer = optimizer_fields()
    # Parameters and optimizer state are replicated, or split over `fsdp` devices
    # (vit_jax/parallel/sharding.py); the batch is split over all data x fsdp devices.
    c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1))  # -1: all devices left
    # Multi-host: see vit_jax/parallel/distributed.py. Nothing set: one process. A process
    # that sends no heartbeat for peer_timeout_seconds is lost: the others stop with 75.
    c.distributed = ml_collections.ConfigDict(
        dict(
            coordinator_address="",
            num_processes=0,
            process_id=-1,
            auto=False,
            timeout_seconds=300,
            peer_timeout_seconds=60,
        )
    )
    # A workdir on gs:// or s3:// that stops answering: every call is retried for at most
    # retry_seconds from the first failure, then the run stops with exit status 75.
    c.store = ml_collections.ConfigDict(dict(retry_seconds=120.0))
    # A step whose loss, gradient or new state is not finite: False stops the run at
    # the next log or save (nothing non-finite is ever saved); True skips the step
    # inside the jitted update (state unchanged, counted in metrics 'skipped').
    c.skip_nonfinite = False
    c.fewshot = fewshot_fields()
    c.log_every = 50
    c.eval_every = 1000
    c.checkpoint_every = 1000
    c.keep_checkpoints = 3
    # Checkpoints that fail verification are set aside (WORKDIR/damaged/<step>) and the
    # run falls back to the newest one that verifies. With none left: False stops with the
    # list of what was found; True starts again from step 0 (vit_jax/workdir/checkpoints.py).
    c.from_scratch_if_damaged = False
    c.export_npz = True  # write workdir/final.npz in the published layout at the end
    c.progress_bars = True
    return c
