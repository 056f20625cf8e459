"""`spacy-elmo embed-corpus`: every text file of a corpus into hdf5, on Ray workers."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from . import _util as opt
from .bilm_source import check_one_bilm
from .command import command
from .corpus_options import cluster_from_options, corpus_options, report


@command("embed-corpus")
def embed_corpus(
    input: str = typer.Argument(
        ..., help="A folder (its *.txt files, recursively), a glob pattern or a text file."
    ),
    output_dir: Path = typer.Argument(
        ..., help="Folder of the outputs: REL/NAME.hdf5 for every input REL/NAME.txt."
    ),
    model: str = opt.model_option(" Every worker loads it: a path on storage all nodes see."),
    options: Optional[Path] = opt.options_option(),
    weights: Optional[Path] = opt.weights_option(),
    top: bool = opt.top_option(),
    average: bool = opt.average_option(),
    pretokenized: Optional[bool] = opt.pretokenized_option(True),
    lang: Optional[str] = opt.lang_option(),
    pipeline: Optional[str] = opt.pipeline_option(),
    code: Optional[Path] = opt.code_option(),
    max_tokens: int = typer.Option(
        256, "--max-tokens", min=1, help="Longer lines run as windows of this many tokens."
    ),
    batch_size: int = opt.batch_size_option(),
    float16: bool = opt.float16_option(),
    bf16: bool = opt.bf16_option(),
    compression: Optional[str] = opt.compression_option(),
    shard_lines: int = typer.Option(
        2000, "--shard-lines", min=1, help="Lines per shard; longer files are cut and joined."
    ),
    workers: Optional[int] = corpus_options.workers(),
    address: Optional[str] = corpus_options.address(),
    threads_per_worker: Optional[int] = corpus_options.threads_per_worker(),
    gpus_per_worker: float = corpus_options.gpus_per_worker(),
    quiet: bool = opt.quiet_option(),
) -> None:
    """Embed a corpus: for every INPUT file REL/NAME.txt, OUTPUT_DIR/REL/NAME.hdf5 in the layout
    of `spacy-elmo embed`, with OUTPUT_DIR/manifest.jsonl. A re-run skips the outputs the
    manifest records as whole for the same input, model and options (docs/corpus.md)."""
    from ..corpus.embed import embed_corpus as run

    check_one_bilm("model", ("options", "weights"), locals())
    if top and average:
        raise ValueError("choose at most one of --top and --average")
    opt.import_code(code)
    if pretokenized is None and lang is None and pipeline is None:  # as `embed` warns
        from ..corpus.plan import find_inputs

        for path in find_inputs(input, (".txt",))[1]:
            if opt.warn_if_raw(path):
                break  # one warning says it
    result = run(
        input,
        output_dir,
        model=model if options is None and weights is None else None,
        options_file=options,
        weights_file=weights,
        output_format="top" if top else "average" if average else "all",
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
        cluster=cluster_from_options(workers, address, threads_per_worker, gpus_per_worker),
        progress=not quiet,
    )
    report(result, output_dir)
