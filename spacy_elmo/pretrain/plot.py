"""PNG plot of train and held-out perplexity from metrics.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

DEFAULT_TITLE = "biLM pretraining"


def plot_metrics(metrics: Path, output: Path, title: str = DEFAULT_TITLE) -> None:
    """Train and held-out perplexity against training tokens, from a run's metrics.jsonl, under
    `title`: say which run or pretraining stage it shows."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    train = [(r["tokens"], r["train_ppl"]) for r in records if "train_ppl" in r]
    steps_to_tokens = {r["step"]: r["tokens"] for r in records if "tokens" in r}
    dev = [
        (steps_to_tokens.get(r["step"], 0), r["dev_ppl_forward"], r["dev_ppl_backward"])
        for r in records
        if "dev_ppl" in r
    ]
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    if train:
        ax.plot(*zip(*train), label="train (fwd+bwd)", color="tab:blue", alpha=0.7)
    if dev:
        tokens, forward, backward = zip(*dev)
        ax.plot(tokens, forward, "o-", label="held-out forward", color="tab:orange")
        ax.plot(tokens, backward, "s-", label="held-out backward", color="tab:green")
    ax.set_xlabel("training tokens")
    ax.set_ylabel("perplexity")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(output)
    plt.close(fig)


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
    dpi = 120  # as plot_metrics saves, so the title has its size there
    fig = plt.figure(figsize=(width / dpi, height / dpi), dpi=dpi)
    fig.figimage(pixels, 0, 0)
    fig.text(0.5, 1 - frame_top / 2 / height, title, ha="center", va="center", fontsize=12)
    fig.savefig(output, dpi=dpi)
    plt.close(fig)
