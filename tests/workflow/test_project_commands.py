"""project.yml's command lines run what exists: every `spacy-elmo` line parses under the
command line as it is, every `python -m workflow.X` names a module, and the evidence lines
parse under its own command line."""

from __future__ import annotations

import importlib.util
import shlex
from pathlib import Path

import srsly
import typer
from weasel.util import substitute_project_variables

from spacy_elmo.cli import app
from workflow.evidence.cli import build_parser

PROJECT = Path(__file__).resolve().parents[2] / "project.yml"


def command_lines() -> list[tuple[str, list[str]]]:
    """(project command, argv) of every script line of project.yml, variables substituted."""
    config = substitute_project_variables(srsly.read_yaml(PROJECT))
    return [(c["name"], shlex.split(line)) for c in config["commands"] for line in c["script"]]


def test_every_spacy_elmo_line_parses():
    group = typer.main.get_command(app)
    seen = set()
    for name, argv in command_lines():
        if argv[0] == "spacy-elmo":
            command, args = argv[1], argv[2:]
        elif "spacy_elmo.cli" in argv:  # under torchrun: python -m torch.distributed.run ...
            at = argv.index("spacy_elmo.cli")
            command, args = argv[at + 1], argv[at + 2 :]
        else:
            continue
        click_command = group.get_command(None, command)
        assert click_command is not None, f"{name}: no command spacy-elmo {command}"
        params = click_command.make_context(command, list(args)).params  # UsageError if not
        assert params.get("output") is not None or command == "perplexity", name
        seen.add(command)
    assert seen == {"pretrain", "perplexity", "probe"}


def test_every_workflow_module_exists_and_evidence_lines_parse():
    modules = set()
    for name, argv in command_lines():
        if argv[:2] == ["python", "-m"] and argv[2].startswith("workflow."):
            assert importlib.util.find_spec(argv[2]) is not None, f"{name}: {argv[2]}"
            modules.add(argv[2])
            if argv[2] == "workflow.evidence":
                build_parser().parse_args(argv[3:])  # SystemExit on an unknown option
    assert {"workflow.fetch_assets", "workflow.evidence", "workflow.compare_evidence"} <= modules
