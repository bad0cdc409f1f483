"""What the three studies share: flags, one cell per (setting, seed), records, table, plot.

A study is a list of settings (name -> config) run for several seeds through the one
training loop (`vit_jax.training.train.run`). Each cell trains in its own directory,
DIR/SETTING/seed_S, and leaves a record.json there when done, so rerunning a study
skips the finished cells and resumes an interrupted one from its checkpoints.
DIR/results.json holds every record, DIR/table.txt the mean and standard deviation
over seeds, DIR/seeds.txt each cell's figure, DIR/NAME.png the plot. Compiled steps
are cached in ~/.cache/vit_jax_studies (the seeds of a setting compile the same steps).

`--only=SETTING --seeds=S` runs that one cell; when the study's reported records
(studies/results/NAME.json, the figures STUDIES.md shows) hold it, the difference
is printed, so a rerun into a fresh --workdir checks a reported figure.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import ml_collections

REPORTED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")

PLAIN = ("step_ms", "mib")  # metrics tabled as they are (the others are fractions, in %)

# A cell function trains one (setting, seed) in a workdir and returns the record's
# metrics: at least 'accuracy' (a fraction in [0, 1]).
CellFn = Callable[[str, int, str, bool], dict[str, Any]]


def parse_flags(argv: Sequence[str] | None, settings: Sequence[str]) -> argparse.Namespace:
    """--seeds, --workdir, --only, --quick; --only must name one of `settings`."""
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", default="0,1,2", help="comma-separated training seeds")
    p.add_argument("--workdir", required=True, help="cells, results.json, table and plot")
    p.add_argument("--only", default="", help=f"run one setting: one of {', '.join(settings)}")
    p.add_argument("--quick", action="store_true", help="a few steps per cell (tests)")
    args = p.parse_args(argv)
    args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    if args.only and args.only not in settings:
        p.error(f"--only={args.only}: expected one of {', '.join(settings)}")
    return args


def quick(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """`config` cut to seconds: a few steps on a few hundred images, a tiny eval.

    Batch sizes are multiples of 8 so that the tests' 8 emulated devices split them.
    """
    config.dataset.train_split = "train[:512]"
    config.dataset.test_split = "test[:128]"
    config.model.update(width=16, depth=1, num_heads=2, mlp_dim=32)
    if config.model.get("representation_size"):
        config.model.representation_size = 16
    config.batch_size = config.eval_batch_size = 32
    config.total_steps = 3
    config.optimizer.warmup_steps = 1
    config.log_every = config.eval_every = config.checkpoint_every = 3
    config.fewshot.batch_size = 64
    return config


def schedule(
    config: ml_collections.ConfigDict, steps: int, log_every: int, seed: int, quick_run: bool
) -> ml_collections.ConfigDict:
    """A study's run: `steps` steps logged every `log_every`, evaluated and saved once at
    the end, with `seed`; cut to seconds by `quick` when `quick_run`."""
    config.total_steps = config.eval_every = config.checkpoint_every = steps
    config.log_every = log_every
    config.seed = seed
    return quick(config) if quick_run else config


# The resize the reported tables were measured with (studies/results/*.json, before the
# package's default became tf_bilinear): a study run on tf_bilinear is a new study, with
# new records, not a rerun of these.
PREPROCESSING = "pil_antialias"


def train_cell(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
    """`vit_jax.training.train.run` without progress bars, on the studies' resize
    (PREPROCESSING); returns its summary."""
    from vit_jax.training import train

    config.progress_bars = False
    config.dataset.preprocessing = PREPROCESSING
    return train.run(config, workdir)


def run_study(
    name: str,
    settings: Sequence[str],
    cell: CellFn,
    argv: Sequence[str] | None = None,
    metrics: Sequence[str] = ("accuracy",),
    plot: Callable[[list[dict], str], None] | None = None,
    labels: dict[str, str] | None = None,
    summary: Callable[[list[dict]], str] | None = None,
) -> list[dict]:
    """Runs the study's cells (skipping finished ones), writes and prints the results.

    Args:
      name: the study's name (records, plot file, reported results file).
      settings: the settings in table order.
      cell: trains one cell: cell(setting, seed, workdir, quick) -> metrics.
      argv: command-line flags (None: sys.argv[1:]).
      metrics: record fields the table shows (mean ± std over seeds).
      plot: plot(records, png_path) draws the study's figure.
      labels: column titles of metrics other than their record field names.
      summary: summary(records) -> text printed after the table when the study ran more
        than one setting (not for a single --only cell).

    Returns:
      The records of this invocation's cells.
    """
    args = parse_flags(argv, settings)
    chosen = [args.only] if args.only else list(settings)
    os.makedirs(args.workdir, exist_ok=True)
    _cache_compilations()
    records = []
    for seed in args.seeds:  # seed by seed: a study cut short still has every setting
        for setting in chosen:
            records.append(_run_cell(name, setting, seed, args.workdir, args.quick, cell))
            _write_results(args.workdir, records)
    table = format_table(records, [s for s in settings if s in chosen], metrics, labels)
    with open(os.path.join(args.workdir, "table.txt"), "w") as f:
        f.write(table + "\n")
    with open(os.path.join(args.workdir, "seeds.txt"), "w") as f:
        f.write(seed_table(records, [s for s in settings if s in chosen], metrics[0]) + "\n")
    print("\n" + table, flush=True)
    if plot is not None:
        plot(records, os.path.join(args.workdir, f"{name}.png"))
    if summary is not None and len(chosen) > 1:
        print(summary(records), flush=True)
    if args.only:
        print(compare_reported(name, records, metrics), flush=True)
    return records


def _run_cell(name: str, setting: str, seed: int, root: str, quick: bool, cell: CellFn) -> dict:
    workdir = os.path.join(root, setting, f"seed_{seed}")
    path = os.path.join(workdir, "record.json")
    if os.path.exists(path):
        with open(path) as f:
            record = json.load(f)
        print(f"[{name}] {setting} seed {seed}: done before, {record['accuracy']:.4f}")
        return record
    print(f"\n[{name}] {setting} seed {seed} in {workdir}", flush=True)
    start = time.time()
    out = cell(setting, seed, workdir, quick)
    os.makedirs(workdir, exist_ok=True)
    record = {
        "study": name,
        "setting": setting,
        "seed": seed,
        **out,
        "wall_seconds": time.time() - start,
        "quick": quick,
        **provenance(),
    }
    with open(path, "w") as f:
        json.dump(record, f, indent=2)
    print(f"[{name}] {setting} seed {seed}: accuracy {record['accuracy']:.4f}", flush=True)
    return record


@functools.cache
def provenance() -> dict[str, str]:
    """Where a record was made: the code's commit ('+changes' when the package or the
    studies differ from it) and the processor, whose vector width changes the floats a
    training run rounds (the same seed reruns exactly only on the same processor kind).
    Read once, when a study's first cell ends: a study runs the code it imported then,
    whatever the checkout does while it runs."""
    import platform
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", "-C", root, *args], capture_output=True, text=True,
                                  check=True).stdout.strip()  # fmt: skip
        except (OSError, subprocess.CalledProcessError):
            return ""

    commit = git("rev-parse", "--short=7", "HEAD") or "unknown"
    if git("status", "--porcelain", "--", "vit_jax", "studies"):
        commit += "+changes"
    return {"commit": commit, "processor": processor_name() or platform.machine()}


def processor_name() -> str:
    """The CPU as far as it decides a float's rounding: its model name, family and model
    (a generation: 'AMD EPYC' names several) and the vector extensions XLA's CPU kernels
    pick from, e.g. 'AMD EPYC, family 25 model 17, avx2 avx512f avx512_bf16'; '' where
    /proc/cpuinfo cannot be read."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        return ""
    flags = set(fields.get("flags", "").split())
    vector = [x for x in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if x in flags]
    return (f"{fields.get('model name', '?')}, family {fields.get('cpu family', '?')} "
            f"model {fields.get('model', '?')}, {' '.join(vector) or 'no avx2'}")  # fmt: skip


def _write_results(root: str, records: list[dict]) -> None:
    with open(os.path.join(root, "results.json"), "w") as f:
        json.dump(records, f, indent=2)


def _cache_compilations() -> None:
    """Seeds of one setting compile the same steps: keep compilations on disk."""
    import jax

    jax.config.update("jax_compilation_cache_dir", os.path.expanduser("~/.cache/vit_jax_studies"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    values = list(values)
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def error_bars(ax, points: list[tuple[float, list[float]]], label: str, color: str) -> None:
    """One series on matplotlib axes: at each x, the mean and standard deviation over seeds
    of the fractions given, in percent.  points: [(x, [value of each seed])]"""
    stats = [mean_std([100 * v for v in values]) for _, values in points]
    ax.errorbar([x for x, _ in points], [m for m, _ in stats], [s for _, s in stats],
                marker="o", capsize=4, color=color, label=label)  # fmt: skip


def by_setting(records: list[dict], metric: str) -> dict[str, list[float]]:
    """{setting: [metric of each seed]} in record order."""
    out: dict[str, list[float]] = {}
    for r in records:
        if r.get(metric) is not None:
            out.setdefault(r["setting"], []).append(r[metric])
    return out


def format_table(
    records: list[dict],
    settings: Sequence[str],
    metrics: Sequence[str] = ("accuracy",),
    labels: dict[str, str] | None = None,
) -> str:
    """One row per setting: seeds, then mean ± std of each metric (in %, but PLAIN ones),
    mean wall time."""
    labels = labels or {}
    pct = {m: 1 if m in PLAIN else 100 for m in metrics}
    head = ["setting", "seeds"] + [labels.get(m, m) + (" (%)" if pct[m] == 100 else "")
                                   for m in metrics] + ["wall s"]  # fmt: skip
    rows = [head]
    for s in settings:
        rs = [r for r in records if r["setting"] == s]
        row = [s, ",".join(str(r["seed"]) for r in rs)]
        for m in metrics:
            vals = [pct[m] * r[m] for r in rs if r.get(m) is not None]
            row.append("{:.2f} ± {:.2f}".format(*mean_std(vals)) if vals else "-")
        row.append(f"{statistics.fmean(r['wall_seconds'] for r in rs):.0f}" if rs else "-")
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["| " + " | ".join(map(str.ljust, r, widths)) + " |" for r in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def seed_table(records: list[dict], settings: Sequence[str], metric: str = "accuracy") -> str:
    """One row per setting, one column per seed: `metric` in % (what --only reproduces)."""
    seeds = sorted({r["seed"] for r in records})
    value = {(r["setting"], r["seed"]): r.get(metric) for r in records}
    lines = ["| setting | " + " | ".join(f"seed {k}" for k in seeds) + " |"]
    lines.append("|---|" + "---|" * len(seeds))
    for s in settings:
        cells = [value.get((s, k)) for k in seeds]
        shown = ["-" if v is None else f"{100 * v:.2f}" for v in cells]
        lines.append(f"| {s} | " + " | ".join(shown) + " |")
    return "\n".join(lines)


def compare_reported(name: str, records: list[dict], metrics: Sequence[str]) -> str:
    """Each rerun cell against the reported record of the same setting and seed."""
    path = os.path.join(REPORTED_DIR, f"{name}.json")
    if not os.path.exists(path):
        return f"no reported results at {path} to compare with"
    with open(path) as f:
        reported = {(r["setting"], r["seed"]): r for r in json.load(f)}
    lines = []
    for r in records:
        ref = reported.get((r["setting"], r["seed"]))
        if ref is None:
            lines.append(f"{r['setting']} seed {r['seed']}: not among the reported cells")
            continue
        for m in metrics:
            if ref.get(m) is None:
                continue
            diff = 100 * (r[m] - ref[m])
            lines.append(
                f"{r['setting']} seed {r['seed']} {m}: now {100 * r[m]:.2f}%, "
                f"reported {100 * ref[m]:.2f}% ({diff:+.2f} points)"
            )
    return "\n".join(lines)


def bar_plot(
    records: list[dict], path: str, settings: Sequence[str], title: str, metric: str = "accuracy"
) -> None:
    """Mean ± std bars of `metric` (in %) per setting, each seed as a dot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    values = by_setting(records, metric)
    shown = [s for s in settings if s in values]
    fig, ax = plt.subplots(figsize=(1.4 * len(shown) + 2, 3.5))
    for i, s in enumerate(shown):
        vals = [100 * v for v in values[s]]
        mean, std = mean_std(vals)
        ax.bar(i, mean, yerr=std, capsize=4, color="C0", alpha=0.6)
        ax.plot([i] * len(vals), vals, "k.", ms=4)
    ax.set_xticks(range(len(shown)), shown)
    low = min(100 * v for s in shown for v in values[s])
    ax.set_ylim(max(0.0, low - 5), None)
    ax.set_ylabel(f"test {metric} (%)")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
