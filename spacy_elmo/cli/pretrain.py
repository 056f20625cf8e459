"""`spacy-elmo pretrain`: train a biLM on your text (wiring over `spacy_elmo.pretrain`).

Each option is a field of `PretrainConfig` under the field's own name (a test checks that the two
match), so the settings are declared once here and validated once there.
"""

from __future__ import annotations

from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any, Optional

import typer

from ..pretrain import PretrainConfig
from ..pretrain.config import DEFAULT_MAX_STEPS
from ..util.files import check_apart
from ..util.json_files import read_json
from . import _util as opt
from .command import command

DEFAULTS = {f.name: f.default for f in fields(PretrainConfig) if f.default is not MISSING}
# Options that are not settings of the run: what to do with the run directory.
NOT_SETTINGS = ("resume", "force", "code", "quiet")


@command("pretrain")
def pretrain(
    ctx: typer.Context,
    inputs: list[Path] = typer.Argument(..., help="Text files or folders (streamed)."),
    output: Path = typer.Argument(..., help="Run directory (the last argument)."),
    preset: str = typer.Option(
        DEFAULTS["preset"], help="Architecture: tiny, bundled, small, medium, original."
    ),
    options: Optional[Path] = typer.Option(
        None, "--options", help="bilm-tf options.json (overrides --preset)."
    ),
    dev: Optional[list[Path]] = typer.Option(
        None, help="Held-out text (default: every --dev-every-th sentence of the inputs)."
    ),
    dev_every: int = typer.Option(DEFAULTS["dev_every"], help="Held out: every Nth sentence."),
    max_dev_sentences: int = typer.Option(DEFAULTS["max_dev_sentences"]),
    lang: Optional[str] = opt.LANG,
    pipeline: Optional[str] = opt.PIPELINE,
    pretokenized: Optional[bool] = opt.pretokenized_option(DEFAULTS["pretokenized"]),
    vocab_size: int = typer.Option(DEFAULTS["vocab_size"], help="Softmax words (top-K)."),
    min_count: int = typer.Option(DEFAULTS["min_count"], help="Minimum count of a softmax word."),
    max_sentence_tokens: int = typer.Option(
        DEFAULTS["max_sentence_tokens"], help="Longer sentences are cut into pieces."
    ),
    max_steps: Optional[int] = typer.Option(
        None,
        help=f"Training steps (batches per rank); default {DEFAULT_MAX_STEPS}, on --resume the "
        "run's own.",
        show_default=False,
    ),
    batch_tokens: int = typer.Option(
        DEFAULTS["batch_tokens"], help="Padded tokens a batch and rank."
    ),
    learning_rate: float = typer.Option(DEFAULTS["learning_rate"], "--learning-rate", "--lr"),
    warmup_steps: int = typer.Option(DEFAULTS["warmup_steps"]),
    dropout: float = typer.Option(DEFAULTS["dropout"]),
    clip_norm: float = typer.Option(DEFAULTS["clip_norm"]),
    eval_every: int = typer.Option(DEFAULTS["eval_every"], help="Held-out perplexity every N."),
    checkpoint_every: int = typer.Option(DEFAULTS["checkpoint_every"], help="Checkpoint every N."),
    log_every: int = typer.Option(DEFAULTS["log_every"]),
    seed: int = typer.Option(DEFAULTS["seed"]),
    gpu_id: int = opt.GPU,
    mixed_precision: bool = typer.Option(DEFAULTS["mixed_precision"], help="bf16 autocast (GPU)."),
    init_from: Optional[str] = typer.Option(
        None,
        help="A biLM to adapt, named as --model is elsewhere ('bundled', a saved, run, "
        "bilm-tf/AllenNLP or ELMoForManyLangs directory).",
    ),
    export_allennlp: bool = typer.Option(
        DEFAULTS["export_allennlp"], help="Also write options.json + hdf5."
    ),
    max_memory_gb: Optional[float] = typer.Option(None, help="Memory budget to check against."),
    threads: Optional[int] = opt.threads_option(),
    code: Optional[Path] = opt.CODE,
    quiet: bool = opt.quiet_option(
        "No progress bar or info lines: only warnings, errors, the result."
    ),
    static_vectors: Optional[str] = typer.Option(
        None, help="spaCy pipeline (name or path) whose static vectors are auxiliary targets."
    ),
    vectors_weight: float = typer.Option(
        DEFAULTS["vectors_weight"], help="Weight of each static-vector loss."
    ),
    resume: bool = typer.Option(
        False,
        help="Continue from OUTPUT/checkpoints/last.pt with the run's settings; --max-steps and "
        "where it runs (--threads, --gpu-id, --max-memory-gb) may change. Another thread count "
        "or device continues the same steps, but its floating-point sums may round differently "
        "(docs/pretraining.md).",
    ),
    force: bool = opt.force_option(
        "the run already in OUTPUT (its corpus, vocabulary, checkpoints and model are deleted)"
    ),
) -> None:
    """Train a biLM on your text (also under `torchrun`, one process a rank).

    An OUTPUT that already holds a run is refused unless --resume or --force is given. On
    --resume a setting given that differs from the run's is an error, except those --resume
    names: a line says what changed, and model/pretrain.json's "ran_with" which values each part
    of the run had. With the same values a resumed run ends bit for bit as an uninterrupted one.
    """
    import logging

    from ..pretrain import pretrain as run_pretraining

    # --init-from continues that biLM with its own architecture, which --preset/--options name
    opt.check_one_bilm(ctx, "init_from", ("preset", "options"), "the architecture")
    opt.device(gpu_id)  # no GPU: one clear error before any work
    check_apart(output, [*inputs, *(dev or [])])
    if init_from is not None and Path(init_from).exists():
        check_apart(output, [init_from], "the --init-from biLM")
    opt.import_code(code)
    level = logging.WARNING if quiet else logging.INFO
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    # The settings given on the command line: on --resume only these are checked against the
    # run's own.
    explicit = {name for name in ctx.params if opt.was_given(ctx, name)}
    config = PretrainConfig(**settings(ctx.params))
    summary = run_pretraining(
        config, resume=resume, overwrite=force, explicit=explicit, progress=not quiet
    )
    if summary.get("interrupted"):
        typer.echo(f"interrupted at step {summary['step']}; continue with --resume")
        # 130 after SIGINT, 143 after SIGTERM, 129 after SIGHUP
        raise typer.Exit(code=128 + (summary.get("signal") or 2))
    if "dev_ppl" in summary:
        plot = output / "perplexity.png"
        typer.echo(
            f"done: {summary['steps']} steps, {summary['tokens_seen']:,} tokens, held-out "
            f"perplexity {summary['dev_ppl']:.1f}; model in {output / 'model'}"
            + (f", perplexity plot {plot}" if plot.exists() else "")
        )


def settings(params: dict[str, Any]) -> dict[str, Any]:
    """`PretrainConfig`'s fields from the command's parameters (paths as strings, the options
    file read, the language standing in for an unnamed pipeline)."""
    values = {name: value for name, value in params.items() if name not in NOT_SETTINGS}
    values["inputs"] = [str(p) for p in params["inputs"]]
    values["output"] = str(params["output"])
    values["dev"] = [str(p) for p in params["dev"] or []]
    values["lang"] = params["lang"] or DEFAULTS["lang"]
    values["pretokenized"] = opt.is_pretokenized(
        params["pretokenized"], params["lang"], params["pipeline"], DEFAULTS["pretokenized"]
    )
    values["options"] = read_json(params["options"], "options file") if params["options"] else None
    return values
