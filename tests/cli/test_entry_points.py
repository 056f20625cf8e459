"""Every entry point the package declares is found by the registry that reads its group, in a
fresh process that has not imported spacy_elmo (a config resolves without an import)."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import distribution

import pytest

# The group an entry point is declared under -> the registry that reads that group.
REGISTRIES = {
    "spacy_factories": None,  # spaCy's factories: looked up by adding the pipe
    "spacy_architectures": "architectures",
    "thinc_layers": "layers",
    "spacy_misc": "misc",
}
SCRIPT = """
import sys
from importlib.metadata import distribution
import spacy
from spacy.util import registry

group, kind = sys.argv[1], sys.argv[2]
points = [p for p in distribution("spacy-elmo").entry_points if p.group == group]
assert "spacy_elmo" not in sys.modules, "spacy_elmo was imported before the lookup"
for point in points:
    if kind == "None":
        nlp = spacy.blank("en")
        nlp.add_pipe(point.name)
        found = nlp.get_factory_meta(point.name).factory
        assert found == point.name, found
    else:
        # Found by name alone; the entry point names the very function the registry holds.
        assert getattr(registry, kind).get(point.name) is point.load(), point.name
    assert "spacy_elmo" in sys.modules
print(len(points))
"""


def declared_groups() -> set[str]:
    points = distribution("spacy-elmo").entry_points
    return {p.group for p in points if p.group != "console_scripts"}


def test_every_group_is_one_a_registry_reads():
    assert declared_groups() == set(REGISTRIES)


@pytest.mark.parametrize("group", sorted(REGISTRIES))
def test_entry_points_resolve_in_a_fresh_process(group):
    kind = str(REGISTRIES[group])
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, group, kind], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert int(result.stdout.split()[-1]) >= 1
