"""The option vocabulary that every `spacy-elmo` command shares, and the checks behind it.

An option means the same in every command that takes it (docs/cli.md, "One vocabulary of
options"); each is declared here once, with the check of its value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

import typer

from .command import fail


def model_option(help_extra: str = "") -> Any:
    return typer.Option(
        "bundled",
        "--model",
        "-m",
        help="The biLM: 'bundled', a published name (small, medium, original, original-5.5b; "
        "after `spacy-elmo download NAME`), a BiLM.save directory, a `spacy-elmo pretrain` run "
        "directory, a bilm-tf/AllenNLP folder or an ELMoForManyLangs directory." + help_extra,
    )


OPTIONS = typer.Option(
    None, "--options", help="bilm-tf/AllenNLP options.json (with --weights, not --model)."
)
WEIGHTS = typer.Option(
    None, "--weights", help="bilm-tf/AllenNLP weights hdf5 (with --options, not --model)."
)
LANG = typer.Option(
    None,
    "--lang",
    "-l",
    help="Language of the tokenizer for raw text (en when none is named); naming one "
    "means the input is raw text.",
    show_default=False,
)
PIPELINE = typer.Option(
    None,
    "--pipeline",
    "-p",
    help="spaCy pipeline (installed name or path) whose tokenizer and sentence boundaries "
    "read raw text, instead of --lang.",
)
CODE = typer.Option(
    None,
    "--code",
    "-c",
    help="Python file imported first, as in spaCy's commands: the registered functions, "
    "components or languages that a pipeline or config names.",
    show_default=False,
)
TOP = typer.Option(False, "--top", help="Write only the top layer, (n, D).")
AVERAGE = typer.Option(False, "--average", help="Write the layer average, (n, D).")
FLOAT16 = typer.Option(
    False,
    "--float16",
    help="Store half precision: half the size, each value within a relative 2^-11 "
    "(4.9e-4) of float32.",
)
BF16 = typer.Option(
    False,
    "--bf16",
    help="Run the biLM's LSTM products in bfloat16 (CPU only; the bundled biLM's vectors "
    "differ from float32 by about 0.2% of their norm; faster only on a CPU with AMX or "
    "AVX-512 BF16, slower elsewhere: docs/performance.md#bfloat16-on-the-cpu).",
)
GPU = typer.Option(-1, "--gpu-id", "-g", help="CUDA device, -1 for the CPU.")
# Where `embed-corpus` and `apply` run: their Ray workers.
ADDRESS = typer.Option(
    None,
    "--address",
    envvar="RAY_ADDRESS",
    help="Join a running Ray cluster (HOST:PORT of its head) instead of starting one.",
)
WORKERS = typer.Option(
    None,
    "--workers",
    "--n-process",
    "-n",
    min=1,
    help="Worker processes (`spacy apply`'s --n-process), each with its own model or pipeline "
    "(default: CPUs / threads per worker). Without --address: starts a local Ray instance "
    "on 127.0.0.1 for this run.",
)
THREADS_PER_WORKER = typer.Option(
    None, "--threads-per-worker", min=1, help="torch threads per worker (CPUs / workers)."
)
GPUS_PER_WORKER = typer.Option(
    None,
    "--gpus-per-worker",
    min=0.0,
    help="GPUs of each worker (fractions share one; default 0, for `apply` 1 with --gpu-id).",
)
MAX_TOKENS = typer.Option(
    256,
    "--max-tokens",
    min=1,
    help="Longer lines run as windows of this many tokens, vectors concatenated.",
)


def pretokenized_option(default: bool) -> Any:
    return typer.Option(
        None,
        "--pretokenized/--raw",
        help="Lines are whitespace-separated tokens, or raw text that --lang/--pipeline "
        + (
            "tokenises. Default: --pretokenized, or --raw when --lang or --pipeline is given."
            if default
            else "tokenises. Default: --raw."
        ),
        show_default=False,
    )


def is_pretokenized(
    pretokenized: Optional[bool], lang: Optional[str], pipeline: Optional[str], default: bool
) -> bool:
    """Whether the input is pre-tokenised: as given, else raw when a tokenizer is named, else
    the command's default. A tokenizer named for pre-tokenised input is a contradiction."""
    named = lang is not None or pipeline is not None
    if pretokenized is None:
        return False if named else default
    if pretokenized and named:
        raise ValueError(
            "--lang/--pipeline name a tokenizer for raw text, but --pretokenized says the lines "
            "are already tokens (split on spaces): give one or the other"
        )
    return pretokenized


def import_code(code: Optional[Path]) -> None:
    """Import `--code` (a Python file) so that what it registers is there for spaCy."""
    if code is None:
        return
    import spacy.util

    path = Path(code)
    if not path.is_file():
        raise FileNotFoundError(f"--code {code}: no such Python file")
    spacy.util.import_file("python_code", path)


def output_format(top: bool, average: bool) -> str:
    """The layers that `--top` and `--average` ask for: 'top', 'average' or (neither) 'all'."""
    if top and average:
        raise ValueError("choose at most one of --top and --average")
    return "top" if top else "average" if average else "all"


def check_compression(value: Optional[str]) -> Optional[str]:
    """--compression is one of the compressions embed_file writes (refused before any work)."""
    if value is not None:
        from ..corpus.embed_file import COMPRESSIONS

        if value not in COMPRESSIONS:
            raise typer.BadParameter(
                f"{value!r} is not one of {', '.join(map(repr, COMPRESSIONS))}"
            )
    return value


COMPRESSION = typer.Option(
    None,
    "--compression",
    callback=check_compression,
    help="Compress each dataset: gzip (level 4) or lzf; lossless, slower to write and read.",
)


def batch_size_option(unit: str = "sentences") -> Any:
    return typer.Option(64, "--batch-size", "-b", min=1, help=f"{unit.capitalize()} a batch.")


def threads_option(default: Optional[int] = None) -> Any:
    """--threads/-t, which the command hands to `util.threads.use_threads`."""
    said = (
        " (default: torch's, at most the CPUs this process may use: its cores, fewer under a "
        "container's CPU quota)"
        if default is None
        else ""  # typer shows the default
    )
    return typer.Option(
        default,
        "--threads",
        "-t",
        help=f"torch CPU threads{said}. Where other jobs keep cores busy, 1 "
        "(docs/performance.md#threads-on-a-shared-machine).",
    )


def quiet_option(what: str = "No progress bar.") -> Any:
    return typer.Option(False, "--quiet", "-q", help=what)


def force_option(what: str = "an existing output") -> Any:
    return typer.Option(False, "--force", "-F", help=f"Replace {what}.")


def device(gpu_id: int) -> str:
    """The torch device of `--gpu-id`; ValueError when that GPU is not there. The one check of
    a GPU for every command, made before any work (and before spaCy's "Using GPU")."""
    if gpu_id < 0:
        return "cpu"
    import torch

    if not torch.cuda.is_available():
        raise ValueError(
            f"--gpu-id {gpu_id}: no CUDA device is available on this machine (use -1 for the CPU)"
        )
    count = torch.cuda.device_count()
    if gpu_id >= count:
        raise ValueError(
            f"--gpu-id {gpu_id}: only {count} CUDA device(s) are available "
            f"(ids 0 to {count - 1}; -1 for the CPU)"
        )
    return f"cuda:{gpu_id}"


def check_new_output(path: Path, force: bool, inputs: list[Path]) -> None:
    """Refuse an output that exists (unless `force`), is an input or cannot be written."""
    from ..util.files import check_output

    check_output(path, inputs)
    if path.exists() and not force:
        raise ValueError(f"output {path} exists; use --force to replace it")


def warn_if_raw(path: Path, name: Optional[str] = None) -> bool:
    """Warn when pre-tokenised input looks like raw text (punctuation stuck to words): whether
    it did. `embed` and `embed-corpus` read their input the same way and warn the same."""
    from ..corpus.embed_file import raw_looking_token

    found = raw_looking_token(path, name=name)
    if found is not None:
        number, token = found
        typer.echo(
            f"warning: {name or path} line {number} has the token '{token}', which looks like raw "
            "text; lines are split on spaces only: give --raw (and --lang) to tokenise them",
            err=True,
        )
    return found is not None


def was_given(context: typer.Context, name: str) -> bool:
    """Whether the user gave the parameter `name` (on the command line or in its environment
    variable) instead of leaving its default."""
    source = context.get_parameter_source(name)  # by name: typer may carry its own click
    return getattr(source, "name", None) in ("COMMANDLINE", "ENVIRONMENT", "PROMPT")


def check_one_bilm(
    context: typer.Context, first: str, seconds: Sequence[str], what: str = "the biLM"
) -> None:
    """End the command (exit code 2, a usage error like typer's own) when the option `first`
    and any of `seconds` were both given, as two ways of naming `what`; one of them would
    otherwise be ignored."""
    named = [name for name in seconds if was_given(context, name)]
    if not was_given(context, first) or not named:
        return
    seconds_given = " ".join(_as_given(context, name) for name in named)
    fail(f"{_as_given(context, first)} and {seconds_given} both name {what}: give one of them", 2)


def _as_given(context: typer.Context, name: str) -> str:
    """`--flag value` of the parameter `name`, with the option's long flag as declared."""
    parameter = {parameter.name: parameter for parameter in context.command.params}[name]
    flag = next(opt for opt in parameter.opts if opt.startswith("--"))
    return f"{flag} {context.params[name]}"


def report(result: Any, output_dir: Path, unit: str = "sentences") -> None:
    """One line of `embed-corpus` and `apply`: what was written and skipped, and how fast
    (`unit`: what the inputs' lines are)."""
    from ..util.files import printable

    output_dir = printable(output_dir)  # a name that is not UTF-8: its bytes as \xNN
    stats = result.stats
    if stats is None:
        typer.echo(f"nothing to do: {len(result.skipped)} outputs in {output_dir} are up to date")
        return
    rate = stats.lines / stats.run_seconds if stats.run_seconds > 0 else 0.0
    typer.echo(
        f"wrote {len(result.written)} outputs ({stats.lines} {unit}, {rate:.1f}/s on "
        f"{len(stats.workers)} workers, Ray start-up {stats.startup_seconds:.1f} s) to "
        f"{output_dir}; {len(result.skipped)} up to date"
    )
