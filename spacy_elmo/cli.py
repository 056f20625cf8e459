"""The `spacy-elmo` command line: wiring only, the work lives in the library."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(
    name="spacy-elmo", help="ELMo contextual word vectors for spaCy.", no_args_is_help=True
)


@app.callback()
def _root() -> None:
    """ELMo contextual word vectors for spaCy."""


def load_bilm(
    model: Optional[Path], options: Optional[Path], weights: Optional[Path], stateful: bool = False
):
    """A biLM from a saved directory or from options.json + weights hdf5."""
    from .bilm import BiLM

    if model is not None and (options is not None or weights is not None):
        raise ValueError("give either --model or --options/--weights, not both")
    if model is not None:
        return BiLM.load(model, stateful=stateful)
    if options is not None and weights is not None:
        return BiLM.from_allennlp(options, weights, stateful=stateful)
    if options is not None or weights is not None:
        raise ValueError("--options and --weights must be given together")
    raise ValueError(
        "no biLM given: pass --model DIR (a directory written by BiLM.save) or "
        "--options options.json --weights weights.hdf5"
    )


@app.command()
def embed(
    input_file: Path = typer.Argument(..., help="Text file, one sentence per line."),
    output_file: Path = typer.Argument(..., help="hdf5 file to write."),
    model: Optional[Path] = typer.Option(None, "--model", "-m", help="Saved biLM directory."),
    options: Optional[Path] = typer.Option(None, help="bilm-tf/AllenNLP options.json."),
    weights: Optional[Path] = typer.Option(None, help="bilm-tf/AllenNLP weights hdf5."),
    top: bool = typer.Option(False, "--top", help="Write only the top layer, (n, D)."),
    average: bool = typer.Option(False, "--average", help="Write the layer average, (n, D)."),
    tokenize: bool = typer.Option(
        False, "--tokenize", help="Tokenise raw lines with spaCy's English tokenizer."
    ),
    batch_size: int = typer.Option(64, "--batch-size", "-b", min=1),
    stateful: bool = typer.Option(
        False, "--stateful", help="Carry LSTM states between batches like AllenNLP."
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """Embed a file: one dataset per line, plus `sentence_to_index` (allennlp elmo layout)."""
    from .embed_file import embed_file, spacy_tokenizer, whitespace_tokenizer

    if top and average:
        _fail("choose at most one of --top and --average")
    try:
        bilm = load_bilm(model, options, weights, stateful=stateful)
        count = embed_file(
            bilm,
            input_file,
            output_file,
            output_format="top" if top else "average" if average else "all",
            batch_size=batch_size,
            tokenize=spacy_tokenizer() if tokenize else whitespace_tokenizer,
            progress=not quiet,
        )
    except (ValueError, OSError) as err:
        _fail(str(err))
    typer.echo(f"wrote {count} sentences to {output_file}")


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=1)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
