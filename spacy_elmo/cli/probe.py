"""`spacy-elmo probe`: the layer probes of Peters et al. (2018), section 5.3 (wiring only)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

from . import _util as opt
from .command import command

REPORT_FILES = ("probe.json", "probe.md", "probe.png")


@command("probe")
def probe(
    ctx: typer.Context,
    output: Path = typer.Argument(..., help="Folder for probe.json, probe.md and probe.png."),
    assets: Path = typer.Option(
        Path("assets"),
        "--assets",
        help="Folder with the probe data (the Brown corpus, a WSJ sample, WordNet); a missing "
        "file is named with the package that holds it.",
    ),
    model: str = opt.model_option(),
    options: Optional[Path] = opt.OPTIONS,
    weights: Optional[Path] = opt.WEIGHTS,
    tasks: str = typer.Option(
        "pos-wsj,pos-brown,wsd", help="Comma-separated subset of pos-wsj, pos-brown, wsd."
    ),
    brown_sentences: int = typer.Option(
        5000, min=10, help="Brown sentences sampled for the POS probe (split 80/20)."
    ),
    batch_size: int = opt.batch_size_option(),
    threads: int = opt.threads_option(default=1),
    gpu_id: int = opt.GPU,
    seed: int = typer.Option(0, help="Seed of the Brown sentence sample."),
    force: bool = opt.force_option("the reports in OUTPUT"),
    quiet: bool = opt.quiet_option("No progress lines, only the report."),
) -> None:
    """Linear POS and 1-NN WSD probes per biLM layer, next to their context-free baselines."""
    from ..bilm import BiLM
    from ..probes import check_assets, parse_tasks, run_probes, write_report
    from ..util.threads import use_threads
    from ..weights.sources import resolve_source

    opt.check_one_bilm(ctx, "model", ("options", "weights"))
    started = time.perf_counter()
    device = opt.device(gpu_id)
    source = resolve_source(model if options is None else None, options, weights)
    if output.exists() and not output.is_dir():
        raise ValueError(f"output {output} is a file; name a folder for the reports")
    paths = check_assets(assets, parse_tasks(tasks))  # names each missing file, where to get it
    for name in REPORT_FILES:  # every report is checked before the probes run
        opt.check_new_output(output / name, force, source.files())
    use_threads(threads, "--threads")
    bilm = BiLM.load(source).to(device)
    result = run_probes(
        bilm,
        paths,
        model=source.name,
        brown_sentences=brown_sentences,
        batch_size=batch_size,
        seed=seed,
        log=(lambda _: None) if quiet else typer.echo,
    )
    result["seconds"] = round(time.perf_counter() - started, 1)
    written = write_report(result, output)
    typer.echo(Path(written[1]).read_text(encoding="utf-8"))
    typer.echo(f"wrote {', '.join(str(p) for p in written)} in {result['seconds']} s")
