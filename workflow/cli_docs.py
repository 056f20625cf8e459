"""docs/cli.md's command reference, generated from the `spacy-elmo` commands themselves.

    python -m workflow.cli_docs [--page docs/cli.md]

Every command, its arguments and each option's flags, default and help, as `--help` shows
them; tests/workflow/test_cli_docs.py checks that the page holds what this writes.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import typer

from workflow.markers import replace_between_markers

PAGE = Path("docs/cli.md")
SECTION = "cli"


def render() -> str:
    """The reference: one block a command, in the order of `spacy-elmo --help`."""
    from spacy_elmo.cli import app

    group = typer.main.get_command(app)
    blocks = []
    for name in sorted(group.commands):
        blocks.append(_command(name, group.commands[name]))
    return "\n".join(blocks)


def _command(name: str, command) -> str:
    # By kind, not class: typer may bring its own copy of click.
    arguments = [p for p in command.params if p.param_type_name == "argument"]
    options = [p for p in command.params if p.param_type_name == "option" and p.name != "help"]
    usage = " ".join(f"{a.name.upper()}{'...' if a.nargs == -1 else ''}" for a in arguments)
    summary = (command.help or "").strip().split("\n\n")[0].replace("\n", " ")
    lines = [f"### `spacy-elmo {name}`", "", summary, "", "```", f"spacy-elmo {name} {usage}"]
    lines.append("```")
    lines += ["", "| argument or option | default | what |", "|---|---|---|"]
    for argument in arguments:
        lines.append(f"| `{argument.name.upper()}` | | {_cell(argument)} |")
    for option in options:
        flags = " / ".join(f"`{flag}`" for flag in [*option.opts, *option.secondary_opts])
        lines.append(f"| {flags} | {_default(option)} | {_cell(option)} |")
    return "\n".join(lines) + "\n"


def _cell(param) -> str:
    text = getattr(param, "help", None) or ""
    return " ".join(text.split()).replace("|", "\\|")


def _default(option) -> str:
    if option.is_flag and option.secondary_opts:
        if option.default is None:  # decided by other options: the help text says how
            return "see what"
        return f"`{option.opts[0] if option.default else option.secondary_opts[0]}`"
    if option.default is None or option.default is False or option.default in ("", ()):
        return ""
    if option.is_flag:
        return "on"
    return f"`{option.default}`"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--page", type=Path, default=PAGE)
    args = parser.parse_args(argv)
    written = replace_between_markers(args.page, SECTION, render())
    return 0 if written else 1


if __name__ == "__main__":
    raise SystemExit(main())
