"""docs/API.md is what workflow/api_docs.py writes from the code (regenerate it when it differs);
the docs and docstrings cite only what ships with the repository (docs/MODEL.md)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_api_reference_is_up_to_date():
    from workflow import api_docs

    expected = api_docs.render()
    assert (REPO / "docs" / "API.md").read_text(encoding="utf-8") == expected, (
        "docs/API.md is out of date: run `python -m workflow.api_docs`"
    )
    for name in ("elmo", "spacy_elmo.ElmoModel.v1", "spacy_elmo.AllenNLPWeights.v1"):
        assert f"### `{name}`" in expected
    assert "| `layer_dropout` |" in expected and "| `cell_clip` |" in expected
    # Every function is described once, under the one group that registers it.
    assert expected.count("Mix the biLM layers of every doc") == 1
    assert expected.count("### `spacy_elmo.ScalarMix.v1`") == 1 and "an alias" not in expected
    assert "`doc._.elmo_mix_coefficients`: c = gamma * s" in expected
    # A loader's `name` is its argument; only the factory's `nlp` and `name` come from spaCy.
    published = expected.split("### `spacy_elmo.PublishedWeights.v1`")[1].split("###")[0]
    assert "| `name` | `str` | `required` |" in published
    factory = expected.split("### `elmo`")[1].split("###")[0]
    assert "| `nlp` |" not in factory and "| `name` |" not in factory


# What users never see: files outside the repository and the wheel.
OUTSIDE_REFERENCES = ("ELMO_SPEC", "../shared", "/work/")
TEXT_SUFFIXES = {".py", ".md", ".json", ".txt", ".cfg", ".toml", ".yml", ".yaml"}
CITATION = re.compile(r"docs/MODEL\.md §(\d+(?:\.\d+)?)(?:-(\d+(?:\.\d+)?))?")
SECTION = re.compile(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", re.MULTILINE)


def text_files(root: Path, folders: tuple[str, ...]) -> list[Path]:
    """README.md and the text files under `folders` of `root`."""
    files = [root / "README.md"]
    for folder in folders:
        files += sorted(
            path
            for path in (root / folder).rglob("*")
            if path.is_file() and path.suffix in TEXT_SUFFIXES
        )
    return files


def outside_references(root: Path) -> list[str]:
    """`file:line: marker` for every mention of a file outside the repository in what ships."""
    found = []
    for path in text_files(root, ("spacy_elmo", "docs")):
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        for number, line in enumerate(lines, 1):
            found += [
                f"{path.relative_to(root)}:{number}: {marker}"
                for marker in OUTSIDE_REFERENCES
                if marker in line
            ]
    return found


def test_docs_and_docstrings_point_only_inside_the_repository(tmp_path):
    assert outside_references(REPO) == [], (
        "cite docs/MODEL.md (or another file of the repository), not files outside it"
    )
    # The check itself finds such a mention.
    (tmp_path / "README.md").write_text("as the spec says (ELMO_SPEC.md §7)\n", encoding="utf-8")
    (tmp_path / "spacy_elmo").mkdir()
    (tmp_path / "spacy_elmo" / "m.py").write_text('"""See ../shared/x."""\n', encoding="utf-8")
    assert outside_references(tmp_path) == [
        "README.md:1: ELMO_SPEC",
        "spacy_elmo/m.py:1: ../shared",
    ]


def test_model_md_citations_name_existing_sections():
    sections = set(SECTION.findall((REPO / "docs" / "MODEL.md").read_text(encoding="utf-8")))
    assert {"1", "3.1", "6.1", "9"} <= sections
    cited = {}
    for path in text_files(REPO, ("spacy_elmo", "docs", "tests", "benchmarks", "workflow")):
        for match in CITATION.finditer(path.read_text(encoding="utf-8", errors="replace")):
            for number in filter(None, match.groups()):
                cited.setdefault(number, str(path.relative_to(REPO)))
    assert {"3", "8", "9"} <= set(cited)
    missing = {number: path for number, path in cited.items() if number not in sections}
    assert not missing, f"docs/MODEL.md has no such sections: {missing}"
