"""The option vocabulary that every `spacy-elmo` command shares, and the checks behind it.

Options mean the same in every command (docs/cli.md):

* `--model/-m` names a biLM in any of the ways `weights.sources.resolve_source` takes;
  `--options/--weights` name a bilm-tf/AllenNLP pair instead (both ways: a usage error,
  `bilm_source.check_one_bilm`).
* `--lang/-l` is the language of the tokenizer for raw text, `--pipeline/-p` a spaCy pipeline
  whose tokenizer and sentence boundaries read it instead (in `init-config`, as in `spacy init
  config`, the list of components); `--pretokenized/--raw` says which kind of text the input is.
* `--code/-c` is a Python file imported first, as in spaCy's commands (every command that loads
  a pipeline or config).
* `--batch-size/-b` counts sentences (documents for `apply`); `--threads/-t` torch CPU threads;
  `--gpu-id/-g` a CUDA device (-1: the CPU).
* A required output is the last argument; an optional one is `--output/-o`. `--force/-F`
  replaces an existing output; `--quiet/-q` hides the progress bar (or progress lines).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer


def model_option(help_extra: str = "") -> Any:
    return typer.Option(
        "bundled",
        "--model",
        "-m",
        help="The biLM: 'bundled', a published name (small, medium, original, original-5.5b; "
        "after `spacy-elmo download NAME`), a BiLM.save directory, a `spacy-elmo pretrain` run "
        "directory, a bilm-tf/AllenNLP folder or an ELMoForManyLangs directory." + help_extra,
    )


def options_option() -> Any:
    return typer.Option(
        None, "--options", help="bilm-tf/AllenNLP options.json (with --weights, not --model)."
    )


def weights_option() -> Any:
    return typer.Option(
        None, "--weights", help="bilm-tf/AllenNLP weights hdf5 (with --options, not --model)."
    )


def lang_option() -> Any:
    return typer.Option(
        None,
        "--lang",
        "-l",
        help="Language of the tokenizer for raw text (en when none is named); naming one "
        "means the input is raw text.",
        show_default=False,
    )


def pipeline_option() -> Any:
    return typer.Option(
        None,
        "--pipeline",
        "-p",
        help="spaCy pipeline (installed name or path) whose tokenizer and sentence boundaries "
        "read raw text, instead of --lang.",
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


def code_option() -> Any:
    return typer.Option(
        None,
        "--code",
        "-c",
        help="Python file imported first, as in spaCy's commands: the registered functions, "
        "components or languages that a pipeline or config names.",
        show_default=False,
    )


def import_code(code: Optional[Path]) -> None:
    """Import `--code` (a Python file) so that what it registers is there for spaCy."""
    if code is None:
        return
    import spacy.util

    path = Path(code)
    if not path.is_file():
        raise FileNotFoundError(f"--code {code}: no such Python file")
    spacy.util.import_file("python_code", path)


def top_option() -> Any:
    return typer.Option(False, "--top", help="Write only the top layer, (n, D).")


def average_option() -> Any:
    return typer.Option(False, "--average", help="Write the layer average, (n, D).")


def float16_option() -> Any:
    return typer.Option(
        False,
        "--float16",
        help="Store half precision: half the size, each value within a relative 2^-11 "
        "(4.9e-4) of float32.",
    )


def compression_option() -> Any:
    return typer.Option(
        None,
        "--compression",
        callback=check_compression,
        help="Compress each dataset: gzip (level 4) or lzf; lossless, slower to write and read.",
    )


def check_compression(value: Optional[str]) -> Optional[str]:
    """--compression is one of the compressions embed_file writes (refused before any work)."""
    if value is not None:
        from ..corpus.embed_file import COMPRESSIONS

        if value not in COMPRESSIONS:
            raise typer.BadParameter(
                f"{value!r} is not one of {', '.join(map(repr, COMPRESSIONS))}"
            )
    return value


def batch_size_option(default: int = 64, unit: str = "sentences") -> Any:
    return typer.Option(default, "--batch-size", "-b", min=1, help=f"{unit.capitalize()} a batch.")


def bf16_option() -> Any:
    return typer.Option(
        False,
        "--bf16",
        help="Run the biLM's LSTM products in bfloat16 (CPU only; the bundled biLM's vectors "
        "differ from float32 by about 0.2% of their norm; faster only on a CPU with AMX or "
        "AVX-512 BF16, slower elsewhere: docs/performance.md#bfloat16-on-the-cpu).",
    )


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


def gpu_option() -> Any:
    return typer.Option(-1, "--gpu-id", "-g", help="CUDA device, -1 for the CPU.")


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
    if gpu_id >= torch.cuda.device_count():
        raise ValueError(
            f"--gpu-id {gpu_id}: only {torch.cuda.device_count()} CUDA device(s) are available "
            f"(ids 0 to {torch.cuda.device_count() - 1}; -1 for the CPU)"
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
