"""`spacy-elmo init-config`: a training config with ELMo for the named components (wiring)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def init_config(
    output_file: Path = typer.Argument(
        ..., help="Config file to write ('-' writes to standard output)."
    ),
    pipeline: str = typer.Option(
        "tagger,parser,ner",
        "--pipeline",
        "-p",
        help="Comma-separated components, each with its own ELMo mix: tagger, morphologizer, "
        "trainable_lemmatizer, parser, ner, spancat, textcat, textcat_multilabel.",
    ),
    model: str = typer.Option(
        "bundled",
        "--model",
        "-m",
        help="'bundled' (the English biLM in the package) or a saved biLM directory "
        "(BiLM.save, or the run directory of `spacy-elmo pretrain`).",
    ),
    options: Optional[Path] = typer.Option(
        None, "--options", help="AllenNLP/bilm-tf options.json (with --weights)."
    ),
    weights: Optional[Path] = typer.Option(
        None, "--weights", help="AllenNLP/bilm-tf weights hdf5 (with --options)."
    ),
    lang: str = typer.Option("en", "--lang", "-l", help="spaCy language code of the pipeline."),
    vectors: Optional[str] = typer.Option(
        None,
        "--vectors",
        help="Static vectors (a spaCy pipeline name or path, e.g. en_core_web_md) added to "
        "every component's token features.",
    ),
    gpu: bool = typer.Option(
        False, "--gpu", "-G", help="Settings for a GPU (PyTorch allocator, larger biLM batches)."
    ),
    fine_tune: bool = typer.Option(
        False,
        "--fine-tune",
        help="Train the biLM's weights with the components (default: frozen, as in the paper; "
        "only the mixes train).",
    ),
    split_sentences: bool = typer.Option(
        True,
        "--split-sentences/--no-split-sentences",
        help="Run the biLM on the sentences of spaCy's rule-based sentencizer when a doc has "
        "no sentence boundaries (the same units in training and on raw text).",
    ),
    elmo_at_output: bool = typer.Option(
        False,
        "--elmo-at-output",
        help="Also concatenate each component's mixed ELMo vector to its encoder's output "
        "(spacy_elmo.ElmoTok2Vec.v2), not only to the encoder's input.",
    ),
    elmo_dropout: float = typer.Option(
        0.0,
        "--elmo-dropout",
        help="Dropout on each component's mixed ELMo vector in training, in [0, 1) "
        "(spacy_elmo.ElmoTok2Vec.v2; the paper's 'moderate amount of dropout to ELMo').",
    ),
    force: bool = typer.Option(False, "--force", "-F", help="Overwrite an existing file."),
) -> None:
    """Write a complete training config: `elmo` and the components that listen to it."""
    from .atomic_files import write_text
    from .init_config import ElmoSource, config_header, config_text, elmo_training_config

    components = [name.strip() for name in pipeline.split(",") if name.strip()]
    to_stdout = str(output_file) == "-"
    try:
        if not to_stdout and output_file.exists() and not force:
            raise ValueError(f"{output_file} exists; use --force to overwrite it")
        if lang != "en" and model == "bundled" and options is None:
            typer.echo(f"warning: the bundled biLM is English, the pipeline is '{lang}'", err=True)
        source = ElmoSource.from_arguments(model, options, weights)
        config = elmo_training_config(
            components,
            source,
            lang=lang,
            vectors=vectors,
            gpu=gpu,
            fine_tune=fine_tune,
            split_sentences=split_sentences,
            elmo_at_output=elmo_at_output,
            elmo_dropout=elmo_dropout,
        )
    except (ValueError, OSError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(code=1) from None
    text = config_header(source, components, gpu) + config_text(config)
    if to_stdout:
        typer.echo(text)
        return
    write_text(output_file, text)  # atomically: an interrupted write leaves no half config
    typer.echo(f"wrote {output_file}: elmo -> {', '.join(components)}; {source.describe()}")
