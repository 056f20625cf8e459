"""docs/cli.md holds the command reference that `python -m workflow.cli_docs` writes."""

from __future__ import annotations

from pathlib import Path

from workflow import cli_docs
from workflow.markers import markers

REPO = Path(__file__).resolve().parents[2]


def test_the_page_is_what_the_commands_say():
    text = (REPO / cli_docs.PAGE).read_text()
    start, end = markers(cli_docs.SECTION)
    section = text[text.index(start) + len(start) : text.index(end)]
    assert section.strip("\n") == cli_docs.render().strip("\n"), (
        "docs/cli.md is out of date: run python -m workflow.cli_docs"
    )


def test_every_command_and_option_is_in_the_reference():
    import typer

    from spacy_elmo.cli import app

    rendered = cli_docs.render()
    for name, command in typer.main.get_command(app).commands.items():
        assert f"### `spacy-elmo {name}`" in rendered
        for param in command.params:
            for flag in getattr(param, "opts", []):
                if flag.startswith("-") and flag not in ("-h", "--help"):
                    assert f"`{flag}`" in rendered, (name, flag)
