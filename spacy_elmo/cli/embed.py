"""`spacy-elmo embed`: a text file's ELMo vectors into hdf5 (the `allennlp elmo` layout)."""

from __future__ import annotations

import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

import typer

from . import _util as opt
from .command import command


@command("embed")
def embed(
    ctx: typer.Context,
    input_file: Path = typer.Argument(
        ..., help="Text file, one sentence per line ('-' reads standard input)."
    ),
    output_file: Path = typer.Argument(..., help="hdf5 file to write."),
    model: str = opt.model_option(),
    options: Optional[Path] = opt.OPTIONS,
    weights: Optional[Path] = opt.WEIGHTS,
    top: bool = opt.TOP,
    average: bool = opt.AVERAGE,
    pretokenized: Optional[bool] = opt.pretokenized_option(True),
    lang: Optional[str] = opt.LANG,
    pipeline: Optional[str] = opt.PIPELINE,
    code: Optional[Path] = opt.CODE,
    batch_size: int = opt.batch_size_option(),
    max_tokens: int = opt.MAX_TOKENS,
    float16: bool = opt.FLOAT16,
    bf16: bool = opt.BF16,
    compression: Optional[str] = opt.COMPRESSION,
    stateful: bool = typer.Option(
        False, "--stateful", help="Carry LSTM states between batches like AllenNLP."
    ),
    threads: Optional[int] = opt.threads_option(),
    gpu_id: int = opt.GPU,
    force: bool = opt.force_option(),
    quiet: bool = opt.quiet_option(),
) -> None:
    """Embed a file: one dataset per line, plus `sentence_to_index` (allennlp elmo layout).

    The output is written under a temporary name and renamed when complete. INPUT_FILE '-'
    reads standard input to its end first.
    """
    from ..bilm import BiLM
    from ..bilm.quantize import quantize_from_flags, set_quantize
    from ..corpus.embed_file import embed_file, spacy_tokenizer, whitespace_tokenizer
    from ..util.threads import use_threads
    from ..weights.sources import resolve_source

    opt.check_one_bilm(ctx, "model", ("options", "weights"))
    with _readable(input_file) as (input_file, input_name):
        layers = opt.output_format(top, average)
        quantize = quantize_from_flags(bf16, gpu_id >= 0, "--gpu-id")
        device = opt.device(gpu_id)
        opt.import_code(code)
        source = resolve_source(model if options is None else None, options, weights)
        opt.check_new_output(output_file, force, [input_file, *source.files()])
        use_threads(threads, "--threads")
        if opt.is_pretokenized(pretokenized, lang, pipeline, default=True):
            tokenize = whitespace_tokenizer
            if pretokenized is None:
                opt.warn_if_raw(input_file, input_name)
        else:
            tokenize = spacy_tokenizer(lang, pipeline)
        bilm = BiLM.load(source, stateful=stateful).to(device)
        if quantize is not None:
            set_quantize(bilm, quantize)
        count = embed_file(
            bilm,
            input_file,
            output_file,
            output_format=layers,
            batch_size=batch_size,
            tokenize=tokenize,
            progress=not quiet,
            float16=float16,
            compression=compression,
            input_name=input_name,
            max_tokens=max_tokens,
        )
    typer.echo(f"wrote {count} sentences to {output_file}")


@contextmanager
def _readable(input_file: Path) -> Iterator[tuple[Path, Optional[str]]]:
    """`input_file` and its name in messages (None: its path); for '-', a copy of standard
    input read to its end, named "standard input"."""
    if str(input_file) != "-":
        yield input_file, None
        return
    with tempfile.TemporaryDirectory(prefix="spacy-elmo-stdin-") as folder:
        copy = Path(folder) / "stdin.txt"
        with open(copy, "wb") as stream:
            shutil.copyfileobj(sys.stdin.buffer, stream)
        yield copy, "standard input"
