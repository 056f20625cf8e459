"""`spacy-elmo embed`: a text file's ELMo vectors into hdf5 (the `allennlp elmo` layout)."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

import typer

from . import _util as opt
from .bilm_source import check_one_bilm
from .command import command


@command("embed")
def embed(
    input_file: Path = typer.Argument(
        ..., help="Text file, one sentence per line ('-' reads standard input)."
    ),
    output_file: Path = typer.Argument(..., help="hdf5 file to write."),
    model: str = opt.model_option(),
    options: Optional[Path] = opt.options_option(),
    weights: Optional[Path] = opt.weights_option(),
    top: bool = opt.top_option(),
    average: bool = opt.average_option(),
    pretokenized: Optional[bool] = opt.pretokenized_option(True),
    lang: Optional[str] = opt.lang_option(),
    pipeline: Optional[str] = opt.pipeline_option(),
    code: Optional[Path] = opt.code_option(),
    batch_size: int = opt.batch_size_option(),
    max_tokens: Optional[int] = typer.Option(
        None,
        "--max-tokens",
        min=1,
        help="Longer lines run as windows of this many tokens, vectors concatenated (256).",
        show_default=False,
    ),
    float16: bool = opt.float16_option(),
    bf16: bool = opt.bf16_option(),
    compression: Optional[str] = opt.compression_option(),
    stateful: bool = typer.Option(
        False, "--stateful", help="Carry LSTM states between batches like AllenNLP."
    ),
    threads: Optional[int] = opt.threads_option(),
    gpu_id: int = opt.gpu_option(),
    force: bool = opt.force_option(),
    quiet: bool = opt.quiet_option(),
) -> None:
    """Embed a file: one dataset per line, plus `sentence_to_index` (allennlp elmo layout).

    The output is written under a temporary name and renamed when complete. INPUT_FILE '-'
    reads standard input to its end first.
    """
    # The options, read by name below: declared once, in this signature.
    given = SimpleNamespace(**{k: v for k, v in locals().items() if k not in _FILES})
    check_one_bilm("model", ("options", "weights"), vars(given))
    if str(input_file) == "-":
        with tempfile.TemporaryDirectory(prefix="spacy-elmo-stdin-") as folder:
            copy = Path(folder) / "stdin.txt"
            with open(copy, "wb") as stream:
                shutil.copyfileobj(sys.stdin.buffer, stream)
            return _embed(copy, "standard input", output_file, given)
    return _embed(input_file, None, output_file, given)


_FILES = ("input_file", "output_file")


def _embed(
    input_file: Path, input_name: Optional[str], output_file: Path, given: SimpleNamespace
) -> None:
    """`embed` of `input_file` (called `input_name` in messages, where it is a copy of
    standard input), with the options `given`."""
    from ..bilm import BiLM
    from ..bilm.quantize import quantize_from_flags, set_quantize
    from ..corpus.embed_file import embed_file, spacy_tokenizer, whitespace_tokenizer
    from ..util.threads import use_threads
    from ..weights.sources import resolve_source

    if given.top and given.average:
        raise ValueError("choose at most one of --top and --average")
    quantize = quantize_from_flags(given.bf16, given.gpu_id >= 0, "--gpu-id")
    device = opt.device(given.gpu_id)
    opt.import_code(given.code)
    source = resolve_source(
        given.model if given.options is None else None, given.options, given.weights
    )
    opt.check_new_output(output_file, given.force, [input_file, *source.files()])
    use_threads(given.threads, "--threads")
    if opt.is_pretokenized(given.pretokenized, given.lang, given.pipeline, default=True):
        tokenize = whitespace_tokenizer
        if given.pretokenized is None:
            opt.warn_if_raw(input_file, input_name)
    else:
        tokenize = spacy_tokenizer(given.lang, given.pipeline)
    bilm = BiLM.from_source(source, stateful=given.stateful).to(device)
    if quantize is not None:
        set_quantize(bilm, quantize)
    count = embed_file(
        bilm,
        input_file,
        output_file,
        output_format="top" if given.top else "average" if given.average else "all",
        batch_size=given.batch_size,
        tokenize=tokenize,
        progress=not given.quiet,
        float16=given.float16,
        compression=given.compression,
        input_name=input_name,
        **({"max_tokens": given.max_tokens} if given.max_tokens is not None else {}),
    )
    typer.echo(f"wrote {count} sentences to {output_file}")
