"""`spacy-elmo embed-corpus`: every text file of a corpus into hdf5, on Ray workers."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from . import _util as opt
from .command import command


@command("embed-corpus")
def embed_corpus(
    ctx: typer.Context,
    input: str = typer.Argument(
        ..., help="A folder (its *.txt files, recursively), a glob pattern or a text file."
    ),
    output_dir: Path = typer.Argument(
        ..., help="Folder of the outputs: REL/NAME.hdf5 for every input REL/NAME.txt."
    ),
    model: str = opt.model_option(" Every worker loads it: a path on storage all nodes see."),
    options: Optional[Path] = opt.OPTIONS,
    weights: Optional[Path] = opt.WEIGHTS,
    top: bool = opt.TOP,
    average: bool = opt.AVERAGE,
    pretokenized: Optional[bool] = opt.pretokenized_option(True),
    lang: Optional[str] = opt.LANG,
    pipeline: Optional[str] = opt.PIPELINE,
    code: Optional[Path] = opt.CODE,
    max_tokens: int = opt.MAX_TOKENS,
    batch_size: int = opt.batch_size_option(),
    float16: bool = opt.FLOAT16,
    bf16: bool = opt.BF16,
    compression: Optional[str] = opt.COMPRESSION,
    shard_lines: int = typer.Option(
        2000, "--shard-lines", min=1, help="Lines per shard; longer files are cut and joined."
    ),
    workers: Optional[int] = opt.WORKERS,
    address: Optional[str] = opt.ADDRESS,
    threads_per_worker: Optional[int] = opt.THREADS_PER_WORKER,
    gpus_per_worker: Optional[float] = opt.GPUS_PER_WORKER,
    quiet: bool = opt.quiet_option(),
) -> None:
    """Embed a corpus: for every INPUT file REL/NAME.txt, OUTPUT_DIR/REL/NAME.hdf5 in the layout
    of `spacy-elmo embed`, with OUTPUT_DIR/manifest.jsonl. A re-run skips the outputs the
    manifest records as whole for the same input, model and options (docs/corpus.md)."""
    from ..corpus.embed import embed_corpus as run
    from ..corpus.engine import Cluster

    opt.check_one_bilm(ctx, "model", ("options", "weights"))
    layers = opt.output_format(top, average)
    opt.import_code(code)
    if pretokenized is None and lang is None and pipeline is None:  # as `embed` warns
        from ..corpus.plan import find_inputs

        for path in find_inputs(input, (".txt",))[1]:
            if opt.warn_if_raw(path):
                break  # one warning says it
    result = run(
        input,
        output_dir,
        model=model,
        options_file=options,
        weights_file=weights,
        output_format=layers,
        pretokenized=opt.is_pretokenized(pretokenized, lang, pipeline, default=True),
        lang=lang or "en",
        pipeline=pipeline,
        max_tokens=max_tokens,
        batch_size=batch_size,
        float16=float16,
        bf16=bf16,
        code=code,
        compression=compression,
        shard_lines=shard_lines,
        cluster=Cluster(workers, address, threads_per_worker, gpus_per_worker or 0.0),
        progress=not quiet,
    )
    opt.report(result, output_dir)
