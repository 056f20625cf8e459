"""`spacy-elmo apply`: a spaCy pipeline over a corpus, a DocBin per input, on Ray workers."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from . import _util as opt
from .command import command


@command("apply")
def apply(
    pipeline: str = typer.Argument(
        ..., help="A spaCy pipeline (installed name or folder), with or without `elmo`."
    ),
    input: str = typer.Argument(
        ..., help="A folder (its .jsonl, .txt and .spacy files, recursively), a glob or a file."
    ),
    output_dir: Path = typer.Argument(
        ..., help="Folder of the outputs: a DocBin REL/NAME.spacy for every input."
    ),
    text_key: str = typer.Option(
        "text", "--text-key", "-tk", help="The field of a .jsonl object that holds the text."
    ),
    code: Optional[Path] = opt.CODE,
    batch_size: int = opt.batch_size_option("documents"),
    shard_docs: int = typer.Option(
        2000, "--shard-docs", min=1, help="Documents per shard; longer files are cut and joined."
    ),
    gpu_id: int = typer.Option(
        -1,
        "--gpu-id",
        "-g",
        help="Run on a GPU (any id >= 0: each worker uses the GPU Ray gives it, "
        "--gpus-per-worker, default 1 then); -1 for the CPU.",
    ),
    workers: Optional[int] = opt.WORKERS,
    address: Optional[str] = opt.ADDRESS,
    threads_per_worker: Optional[int] = opt.THREADS_PER_WORKER,
    gpus_per_worker: Optional[float] = opt.GPUS_PER_WORKER,
    quiet: bool = opt.quiet_option(),
) -> None:
    """Annotate a corpus with a spaCy pipeline, like `spacy apply`: every .jsonl (one object per
    line), .txt (one document per line) and .spacy input gives OUTPUT_DIR/REL/NAME.spacy, with
    OUTPUT_DIR/manifest.jsonl and the resumption of embed-corpus (docs/corpus.md)."""
    from ..corpus.apply import apply_corpus
    from ..corpus.engine import Cluster

    if address is None:  # a local Ray instance: this machine's GPUs
        opt.device(gpu_id)
    opt.import_code(code)
    gpus = gpus_per_worker if gpus_per_worker is not None else (1.0 if gpu_id >= 0 else 0.0)
    result = apply_corpus(
        pipeline,
        input,
        output_dir,
        text_key=text_key,
        code=code,
        batch_size=batch_size,
        shard_docs=shard_docs,
        cluster=Cluster(workers, address, threads_per_worker, gpus),
        progress=not quiet,
    )
    opt.report(result, output_dir, unit="documents")
