"""One biLM per command: the options that name a biLM two ways are refused together.

`--model` names a biLM by name or folder, `--options/--weights` name a bilm-tf/AllenNLP pair,
and `pretrain --init-from` names the biLM whose architecture a run continues (which `--preset`
and `--options` would otherwise name). Given together, one of them would be ignored; instead
the command ends before any work with one line naming both, and exit code 2 (a usage error,
as typer's own).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import typer

from .command import fail

# Where a value came from when the user gave it (by name: typer may bring its own copy of
# click's ParameterSource).
GIVEN_SOURCES = ("COMMANDLINE", "ENVIRONMENT", "PROMPT")


def check_one_bilm(
    first: str, seconds: Sequence[str], values: dict[str, Any], what: str = "the biLM"
) -> None:
    """End the command (exit code 2) when the option `first` and any of `seconds` were both
    given, as two ways of naming `what`: `values` maps each parameter's name to its value (the
    command's `locals()`).

    An option counts as given when the command line (or its environment variable) set it, as
    the click context of the running command says.
    """
    context = _current_context()
    given_first = _given(context, first, values)
    given_seconds = [name for name in seconds if _given(context, name, values)]
    if given_first is None or not given_seconds:
        return
    named = " ".join(filter(None, (_given(context, name, values) for name in given_seconds)))
    fail(f"{given_first} and {named} both name {what}: give one of them", code=2)


def _current_context() -> typer.Context:
    """The running command's context (typer 0.2x carries its own copy of click)."""
    try:
        from typer._click.globals import get_current_context
    except ImportError:  # a typer that runs on the click package
        from click import get_current_context
    return get_current_context()


def _given(context: typer.Context, name: str, values: dict[str, Any]) -> Optional[str]:
    """`--flag value` as the user gave it, or None when `name` keeps its default."""
    source = context.get_parameter_source(name)
    if getattr(source, "name", None) not in GIVEN_SOURCES:
        return None
    return f"{_flag(context, name)} {values.get(name)}"


def _flag(context: typer.Context, name: str) -> str:
    """The option's long flag (`--init-from`) as the command declares it."""
    for parameter in context.command.params:
        if parameter.name == name:
            return next(opt for opt in parameter.opts if opt.startswith("--"))
    raise KeyError(f"the command `{context.command.name}` has no option {name!r}")
