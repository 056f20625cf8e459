"""`spacy-elmo init-config`: a training config with ELMo for the named components (wiring)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from . import _util as opt
from .command import command


@command("init-config")
def init_config(
    ctx: typer.Context,
    output_file: Path = typer.Argument(
        ..., help="Config file to write ('-' writes to standard output)."
    ),
    components: str = typer.Option(
        "tagger,parser,ner",
        "--pipeline",
        "-p",
        "--components",
        help="Comma-separated components, each with its own ELMo mix (as `spacy init config "
        "--pipeline`): tagger, morphologizer, trainable_lemmatizer, parser, ner, spancat, "
        "textcat, textcat_multilabel.",
    ),
    model: str = opt.model_option(),
    options: Optional[Path] = opt.OPTIONS,
    weights: Optional[Path] = opt.WEIGHTS,
    lang: str = typer.Option("en", "--lang", "-l", help="spaCy language code of the pipeline."),
    vectors: Optional[str] = typer.Option(
        None,
        "--vectors",
        help="Static vectors (a spaCy pipeline name or path, e.g. en_core_web_md) added to "
        "every component's token features.",
    ),
    for_gpu: bool = typer.Option(
        False, "--for-gpu", "-G", help="Settings for training on a GPU (allocator, batch sizes)."
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
    vector_hooks: Optional[bool] = typer.Option(
        None,
        "--vector-hooks/--no-vector-hooks",
        help="ELMo behind token.vector, doc.vector and .similarity of the trained pipeline "
        "(the elmo component's vector_hooks; default: on unless --vectors is given).",
    ),
    force: bool = opt.force_option(),
    code: Optional[Path] = opt.CODE,
) -> None:
    """Write a complete training config: `elmo` and the components that listen to it."""
    import spacy

    from ..pipeline import init_config as configs
    from ..util.files import write_text
    from ..weights.sources import resolve_source

    opt.check_one_bilm(ctx, "model", ("options", "weights"))
    opt.import_code(code)  # a custom language or architecture the config names
    names = [name.strip() for name in components.split(",") if name.strip()]
    to_stdout = str(output_file) == "-"
    if not to_stdout:
        opt.check_new_output(output_file, force, [])
    spacy.util.get_lang_class(lang)  # an unknown language fails here, with spaCy's message
    source = resolve_source(model, options, weights)
    bilm = configs.describe_bilm(source)
    if lang != "en" and source.kind == "bundled":
        typer.echo(f"warning: the bundled biLM is English, the pipeline is '{lang}'", err=True)
    config = configs.elmo_training_config(
        names,
        source,
        lang=lang,
        vectors=vectors,
        gpu=for_gpu,
        fine_tune=fine_tune,
        split_sentences=split_sentences,
        vector_hooks=vector_hooks,
    )
    text = configs.config_header(bilm, names, for_gpu) + configs.config_text(config)
    if to_stdout:
        typer.echo(text)
        return
    write_text(output_file, text)  # atomically: an interrupted write leaves no half config
    typer.echo(f"wrote {output_file}: elmo -> {', '.join(names)}; {bilm}")
