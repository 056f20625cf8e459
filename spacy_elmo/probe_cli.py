"""`spacy-elmo probe`: the layer probes of Peters et al. (2018), section 5.3 (wiring only)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer


def probe(
    assets: Path = typer.Option(
        Path("assets"), "--assets", help="Asset folder (scripts/fetch_assets.py --dest)."
    ),
    output: Path = typer.Option(..., "--output", "-o", help="Writes probe.json, .md and .png."),
    model: Optional[Path] = typer.Option(
        None, "--model", "-m", help="Saved biLM directory (default: the bundled English biLM)."
    ),
    options: Optional[Path] = typer.Option(None, help="bilm-tf/AllenNLP options.json."),
    weights: Optional[Path] = typer.Option(None, help="bilm-tf/AllenNLP weights hdf5."),
    tasks: str = typer.Option(
        "pos-wsj,pos-brown,wsd", help="Comma-separated subset of pos-wsj, pos-brown, wsd."
    ),
    brown_sentences: int = typer.Option(
        5000, min=10, help="Brown sentences sampled for the POS probe (split 80/20)."
    ),
    batch_size: int = typer.Option(64, "--batch-size", "-b", min=1),
    threads: int = typer.Option(1, min=1, help="torch CPU threads."),
    seed: int = typer.Option(0, help="Seed of the Brown sentence sample."),
) -> None:
    """Linear POS and 1-NN WSD probes per biLM layer, next to their context-free baselines."""
    import torch

    from .cli_common import fail, load_bilm
    from .probe import ProbeSettings, parse_tasks, run_probes, write_report

    torch.set_num_threads(threads)
    started = time.perf_counter()
    try:
        settings = ProbeSettings(
            tasks=parse_tasks(tasks),
            brown_sentences=brown_sentences,
            batch_size=batch_size,
            seed=seed,
            model=str(model or (f"{options} + {weights}" if options else "bundled")),
        )
        bilm = load_bilm(model, options, weights)
        result = run_probes(bilm, assets, settings, log=typer.echo)
        result["seconds"] = round(time.perf_counter() - started, 1)
        written = write_report(result, output)
    except (ValueError, OSError) as err:
        fail(str(err))
    typer.echo(Path(written[1]).read_text(encoding="utf-8"))
    typer.echo(f"wrote {', '.join(str(p) for p in written)} in {result['seconds']} s")
