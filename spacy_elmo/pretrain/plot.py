"""PNG plot of train and held-out perplexity from metrics.jsonl."""

from __future__ import annotations

import json
from pathlib import Path


def plot_metrics(metrics: Path, output: Path, title: str = "biLM pretraining") -> None:
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
