"""Copy a pretraining run's model into the package as the bundled English biLM.

    python -m workflow.bundle_model training/bundled_v2 spacy_elmo/data/en_elmo_bundled \
        --first-stage training/bundled

Copies config.json, model.safetensors, lm_head.safetensors, vocab.txt and pretrain.json
(with the perplexities that `evaluate-lm` wrote: held-out, held-out without the CoNLL
lines, CoNLL-2003 dev), checks that the copy loads and that the files stay within the size
budget, and plots the run's perplexity into docs/ with the stage in its title. With
`--first-stage` (the run the bundled run was initialised from, `--init-from`, or the bundled
pretrain.json of that model, which lists its own stages), pretrain.json records every stage
and the totals over them: tokens seen, steps and training time.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from spacy_elmo.pipeline.loaders import BUNDLED_FILES, BUNDLED_MAX_BYTES

# pretrain.json key: (the run's perplexity file, from `spacy-elmo perplexity --output`; what
# it measured, as the model card says it)
PERPLEXITIES = {
    "held_out": ("perplexity.json", "held-out perplexity"),
    "held_out_general": (
        "perplexity_general.json",
        "held-out, without the CoNLL-2003 lines that stage 3 reads",
    ),
    "conll_dev": (
        "perplexity_conll_dev.json",
        "CoNLL-2003 dev sentences (in-domain, read by no stage)",
    ),
}


def first_stage_summary(path: Path) -> dict:
    for candidate in (path / "model" / "pretrain.json", path / "pretrain.json", path):
        if candidate.is_file():
            return json.loads(candidate.read_text())
    sys.exit(f"--first-stage {path}: no pretrain.json there")


def with_first_stage(summary: dict, first: dict) -> dict:
    """Totals over all stages at the top level, each stage's own figures under "stages".

    `first` is the summary of the run this one continued from; when it lists stages itself
    (a bundled pretrain.json), those are the earlier stages.
    """
    keys = ("steps", "tokens_seen", "train_seconds", "world_size", "static_vectors")
    earlier = first.get("stages") or [{k: first.get(k) for k in keys if k in first}]
    stages = [*earlier, {k: summary.get(k) for k in keys if k in summary}]
    total = {
        "steps": sum(stage["steps"] for stage in stages),
        "tokens_seen": sum(stage["tokens_seen"] for stage in stages),
        "train_seconds": round(sum(stage["train_seconds"] for stage in stages), 1),
    }
    return {**summary, **total, "stages": stages}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="pretraining output directory")
    parser.add_argument("target", type=Path, help="package data directory")
    parser.add_argument("--docs", type=Path, default=Path("docs"))
    parser.add_argument(
        "--first-stage",
        type=Path,
        action="append",
        help="a run (or model directory) that the bundled run continued from: its "
        "pretrain.json; repeat it for each earlier stage, the earliest first",
    )
    args = parser.parse_args()
    model = args.run / "model"
    missing = [name for name in BUNDLED_FILES if not (model / name).exists()]
    if missing:
        sys.exit(f"{model} lacks {', '.join(missing)}: has the pretraining run finished?")
    size = sum((model / name).stat().st_size for name in BUNDLED_FILES)
    if size > BUNDLED_MAX_BYTES:
        sys.exit(
            f"the model files take {size / 1e6:.1f} MB, more than {BUNDLED_MAX_BYTES / 1e6:.0f} MB"
        )
    args.target.mkdir(parents=True, exist_ok=True)
    for name in BUNDLED_FILES:
        shutil.copyfile(model / name, args.target / name)
    summary = json.loads((model / "pretrain.json").read_text())
    for key, (name, _) in PERPLEXITIES.items():  # written by `spacy project run evaluate-lm`
        if (args.run / name).exists():
            summary[key] = json.loads((args.run / name).read_text())
    earlier = None
    for path in args.first_stage or []:
        stage = first_stage_summary(path)
        earlier = stage if earlier is None else with_first_stage(stage, earlier)
    if earlier is not None:
        summary = with_first_stage(summary, earlier)
    (args.target / "pretrain.json").write_text(json.dumps(summary, indent=2) + "\n")
    args.docs.mkdir(parents=True, exist_ok=True)
    stage = len(summary.get("stages") or [summary])
    title = f"Bundled biLM, pretraining stage {stage} of {stage} ({args.run.name})"
    if (args.run / "metrics.jsonl").exists():  # the plot again, saying which stage it shows
        from spacy_elmo.pretrain.plot import plot_metrics

        plot_metrics(args.run / "metrics.jsonl", args.docs / "bundled_perplexity.png", title)
    elif (args.run / "perplexity.png").exists():  # only the run's own plot: its title replaced
        retitle_plot(args.run / "perplexity.png", args.docs / "bundled_perplexity.png", title)

    from spacy_elmo import BiLM

    bilm = BiLM.load(args.target)
    vectors = bilm.embed([["The", "river", "bank", "."]])[0]
    print(f"bundled {size / 1e6:.1f} MB into {args.target}; output shape {vectors.shape}")


def retitle_plot(image: Path, output: Path, title: str) -> None:
    """A saved perplexity plot with its title replaced by `title`, for a run whose
    metrics.jsonl was not kept: the band above the plot's frame (the first row that is mostly
    dark) is cleared and the new title drawn there; the plot itself is copied pixel for pixel."""
    import matplotlib

    matplotlib.use("Agg")
    import numpy
    from matplotlib import image as mpimage
    from matplotlib import pyplot as plt

    pixels = mpimage.imread(image)
    if pixels.ndim != 3 or pixels.shape[2] not in (3, 4):
        raise ValueError(f"{image}: expected an RGB or RGBA plot, got an array of {pixels.shape}")
    height, width = pixels.shape[:2]
    dark = (pixels[..., :3].mean(axis=2) < 0.5).mean(axis=1) > 0.5
    if not dark.any():
        raise ValueError(f"{image}: no plot frame found (no row is mostly dark)")
    frame_top = int(numpy.argmax(dark))
    pixels = pixels.copy()
    pixels[:frame_top] = 1.0  # white, alpha 1
    dpi = 120  # as spacy_elmo.pretrain.plot.plot_metrics saves, so the title has its size there
    fig = plt.figure(figsize=(width / dpi, height / dpi), dpi=dpi)
    fig.figimage(pixels, 0, 0)
    fig.text(0.5, 1 - frame_top / 2 / height, title, ha="center", va="center", fontsize=12)
    fig.savefig(output, dpi=dpi)
    plt.close(fig)


if __name__ == "__main__":
    main()
