"""`spacy-elmo perplexity`: a pretrained biLM's held-out perplexity (wiring)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from . import _util as opt
from .command import command


@command("perplexity")
def perplexity(
    inputs: list[Path] = typer.Argument(..., help="Held-out text files or folders."),
    model: str = opt.model_option(
        " It needs its softmax: the bundled biLM or one written by `spacy-elmo pretrain`."
    ),
    pretokenized: Optional[bool] = opt.pretokenized_option(False),
    lang: Optional[str] = opt.LANG,
    pipeline: Optional[str] = opt.PIPELINE,
    code: Optional[Path] = opt.CODE,
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write the JSON here."),
    force: bool = opt.force_option(),
    threads: Optional[int] = opt.threads_option(),
) -> None:
    """Forward, backward and average perplexity of a pretrained biLM on held-out text.

    The JSON (standard output, and --output) holds the vocabulary's size, the tokens scored and
    the out-of-vocabulary rate beside the perplexities; a line of text on standard error says
    the same. Two models' perplexities compare only on the same text, tokenised the same way,
    with the same vocabulary (docs/pretraining.md).
    """
    from ..pretrain.evaluate import describe
    from ..pretrain.evaluate import perplexity as compute
    from ..util.files import write_text
    from ..util.threads import use_threads
    from ..weights.sources import resolve_source

    opt.import_code(code)
    source = resolve_source(model)
    if output is not None:
        opt.check_new_output(output, force, [*source.files(), *inputs])
    use_threads(threads, "--threads")
    result = compute(
        source,
        inputs,
        pretokenized=opt.is_pretokenized(pretokenized, lang, pipeline, default=False),
        lang=lang or "en",
        pipeline=pipeline,
    )
    text = json.dumps(result, indent=2)
    if output is not None:
        write_text(output, text + "\n")
    typer.echo(text)
    typer.echo(describe(result), err=True)
