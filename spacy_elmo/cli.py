"""The `spacy-elmo` command line: wiring only, the work lives in the library."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Optional

import typer

from .cli_common import fail, load_bilm
from .pretrain.trainer import DEFAULT_MAX_STEPS, PretrainConfig

# The defaults of `spacy-elmo pretrain` are those of the run's settings.
PRETRAIN_DEFAULTS = {f.name: f.default for f in fields(PretrainConfig)}

app = typer.Typer(
    name="spacy-elmo", help="ELMo contextual word vectors for spaCy.", no_args_is_help=True
)


@app.callback()
def _root() -> None:
    """ELMo contextual word vectors for spaCy."""


@app.command()
def embed(
    input_file: Path = typer.Argument(..., help="Text file, one sentence per line."),
    output_file: Path = typer.Argument(..., help="hdf5 file to write."),
    model: Optional[Path] = typer.Option(
        None,
        "--model",
        "-m",
        help="Saved biLM directory or ELMoForManyLangs model directory (default: the bundled "
        "English biLM).",
    ),
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
    max_tokens: Optional[int] = typer.Option(
        None,
        "--max-tokens",
        min=1,
        help="Longer lines run as windows of this many tokens, vectors concatenated (256).",
        show_default=False,
    ),
) -> None:
    """Embed a file: one dataset per line, plus `sentence_to_index` (allennlp elmo layout).

    The output is written under a temporary name and renamed when complete.
    """
    from .atomic_files import check_output
    from .embed_file import embed_file, spacy_tokenizer, whitespace_tokenizer

    if top and average:
        fail("choose at most one of --top and --average")
    try:
        model_files = sorted(model.iterdir()) if model is not None and model.is_dir() else []
        check_output(output_file, [input_file, *model_files, *filter(None, [options, weights])])
        bilm = load_bilm(model, options, weights, stateful=stateful)
        count = embed_file(
            bilm,
            input_file,
            output_file,
            output_format="top" if top else "average" if average else "all",
            batch_size=batch_size,
            tokenize=spacy_tokenizer() if tokenize else whitespace_tokenizer,
            progress=not quiet,
            **({"max_tokens": max_tokens} if max_tokens is not None else {}),
        )
    except (ValueError, OSError) as err:
        fail(str(err))
    typer.echo(f"wrote {count} sentences to {output_file}")


@app.command()
def pretrain(
    ctx: typer.Context,
    inputs: list[Path] = typer.Argument(..., help="Text files or folders (streamed)."),
    output: Path = typer.Option(..., "--output", "-o", help="Run directory."),
    preset: str = typer.Option(
        PRETRAIN_DEFAULTS["preset"], help="Architecture: tiny, bundled, small, medium, original."
    ),
    options: Optional[Path] = typer.Option(
        PRETRAIN_DEFAULTS["options"], help="bilm-tf options.json (overrides --preset)."
    ),
    dev: Optional[list[Path]] = typer.Option(
        None, help=f"Held-out text (default: every {PRETRAIN_DEFAULTS['dev_every']}th sentence)."
    ),
    pipeline: str = typer.Option(
        PRETRAIN_DEFAULTS["pipeline"], help="spaCy pipeline or language code for raw text."
    ),
    pretokenized: bool = typer.Option(
        PRETRAIN_DEFAULTS["pretokenized"], help="Inputs are one tokenised sentence per line."
    ),
    vocab_size: int = typer.Option(
        PRETRAIN_DEFAULTS["vocab_size"], help="Softmax vocabulary size (top-K words)."
    ),
    min_count: int = typer.Option(
        PRETRAIN_DEFAULTS["min_count"], help="Minimum count of a softmax word."
    ),
    max_steps: Optional[int] = typer.Option(
        None,
        help=f"Training steps (batches per rank); default {DEFAULT_MAX_STEPS}, on --resume the "
        "run's own.",
        show_default=False,
    ),
    batch_tokens: int = typer.Option(
        PRETRAIN_DEFAULTS["batch_tokens"], help="Padded tokens per batch and rank."
    ),
    learning_rate: float = typer.Option(PRETRAIN_DEFAULTS["learning_rate"], "--lr"),
    warmup_steps: int = typer.Option(PRETRAIN_DEFAULTS["warmup_steps"]),
    dropout: float = typer.Option(PRETRAIN_DEFAULTS["dropout"]),
    clip_norm: float = typer.Option(PRETRAIN_DEFAULTS["clip_norm"]),
    eval_every: int = typer.Option(
        PRETRAIN_DEFAULTS["eval_every"], help="Held-out perplexity every N steps."
    ),
    checkpoint_every: int = typer.Option(
        PRETRAIN_DEFAULTS["checkpoint_every"], help="Checkpoint every N steps."
    ),
    log_every: int = typer.Option(PRETRAIN_DEFAULTS["log_every"]),
    seed: int = typer.Option(PRETRAIN_DEFAULTS["seed"]),
    gpu_id: int = typer.Option(PRETRAIN_DEFAULTS["gpu_id"], help="CUDA device (-1: CPU)."),
    mixed_precision: bool = typer.Option(
        PRETRAIN_DEFAULTS["mixed_precision"], help="bf16 autocast (GPU)."
    ),
    init_from: Optional[Path] = typer.Option(
        PRETRAIN_DEFAULTS["init_from"], help="Saved or bilm-tf biLM to adapt."
    ),
    export_allennlp: bool = typer.Option(
        PRETRAIN_DEFAULTS["export_allennlp"], help="Also write options.json + hdf5."
    ),
    resume: bool = typer.Option(False, help="Continue from OUTPUT/checkpoints/last.pt."),
    overwrite: bool = typer.Option(
        False, help="Delete the run already in OUTPUT (corpus, vocab, checkpoints, model) first."
    ),
    max_memory_gb: Optional[float] = typer.Option(
        PRETRAIN_DEFAULTS["max_memory_gb"], help="Memory budget to check against."
    ),
    threads: Optional[int] = typer.Option(PRETRAIN_DEFAULTS["threads"], help="torch CPU threads."),
    static_vectors: Optional[str] = typer.Option(
        PRETRAIN_DEFAULTS["static_vectors"],
        help="spaCy pipeline (name or path) whose static vectors are auxiliary targets.",
    ),
    vectors_weight: float = typer.Option(
        PRETRAIN_DEFAULTS["vectors_weight"], help="Weight of each static-vector loss."
    ),
) -> None:
    """Train a biLM on your text (also under `torchrun --nproc_per_node N`).

    An OUTPUT that already holds a run is refused unless --resume or --overwrite is given; on
    --resume the run's settings are kept (a setting given that differs is an error), and only
    --max-steps may change.
    """
    import logging

    from .pretrain import pretrain as run_pretraining

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    # The settings given on the command line (on --resume only these are checked against the
    # run's own). By name: typer may bring its own copy of click's ParameterSource.
    explicit = {
        name
        for name in ctx.params
        if getattr(ctx.get_parameter_source(name), "name", None)
        in ("COMMANDLINE", "ENVIRONMENT", "PROMPT")
    }
    try:
        config = PretrainConfig(
            inputs=[str(p) for p in inputs],
            output=str(output),
            preset=preset,
            options=_read_json(options, "options file") if options else None,
            dev=[str(p) for p in dev or []],
            pipeline=pipeline,
            pretokenized=pretokenized,
            vocab_size=vocab_size,
            min_count=min_count,
            max_steps=max_steps,
            batch_tokens=batch_tokens,
            learning_rate=learning_rate,
            warmup_steps=warmup_steps,
            dropout=dropout,
            clip_norm=clip_norm,
            eval_every=eval_every,
            checkpoint_every=checkpoint_every,
            log_every=log_every,
            seed=seed,
            gpu_id=gpu_id,
            mixed_precision=mixed_precision,
            init_from=str(init_from) if init_from else None,
            export_allennlp=export_allennlp,
            max_memory_gb=max_memory_gb,
            threads=threads,
            static_vectors=static_vectors,
            vectors_weight=vectors_weight,
        )
        summary = run_pretraining(config, resume=resume, overwrite=overwrite, explicit=explicit)
    except (ValueError, OSError) as err:
        fail(str(err))
    if summary.get("interrupted"):
        typer.echo(f"interrupted at step {summary['step']}; continue with --resume")
        raise typer.Exit(code=130)
    if "dev_ppl" in summary:
        typer.echo(
            f"done: {summary['steps']} steps, {summary['tokens_seen']:,} tokens, held-out "
            f"perplexity {summary['dev_ppl']:.1f}; model in {output / 'model'}"
        )


@app.command()
def perplexity(
    model: Path = typer.Argument(..., help="Model directory written by `spacy-elmo pretrain`."),
    inputs: list[Path] = typer.Argument(..., help="Held-out text files or folders."),
    pretokenized: bool = typer.Option(
        PRETRAIN_DEFAULTS["pretokenized"],
        help="One tokenised sentence per line (as `pretrain` writes its held-out cache, "
        "OUTPUT/corpus/dev.txt); otherwise raw text, tokenised with --pipeline.",
    ),
    pipeline: str = typer.Option("en", help="spaCy pipeline for raw text."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write the JSON here."),
) -> None:
    """Forward, backward and average perplexity of a pretrained biLM on held-out text."""
    import json

    from .atomic_files import check_output, write_text
    from .pretrain.evaluate import perplexity as compute

    try:
        if output is not None:
            model_files = sorted(model.iterdir()) if model.is_dir() else []
            check_output(output, [*model_files, *inputs])
        result = compute(model, inputs, pretokenized=pretokenized, pipeline=pipeline)
        text = json.dumps(result, indent=2)
        if output is not None:
            write_text(output, text + "\n")
    except (ValueError, OSError) as err:
        fail(str(err))
    typer.echo(text)


from .probe_cli import probe as _probe  # noqa: E402

app.command(name="probe")(_probe)

from .init_config_cli import init_config as _init_config  # noqa: E402

app.command(name="init-config")(_init_config)

from .debug_model_cli import debug_model as _debug_model  # noqa: E402

app.command(
    name="debug-model",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)(_debug_model)


def _read_json(path: Path, what: str):
    """A JSON file's content; ValueError naming the file when it is not JSON."""
    import json

    try:
        return json.loads(path.read_text(encoding="utf-8-sig"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{what} {path} is not valid JSON: {err}") from None


def main() -> None:
    app()


if __name__ == "__main__":
    main()
