"""The README is a front door and the docs pages hold together: the README stays short, no page
states a test count (it goes stale with every commit), every relative link of README.md and
docs/*.md reaches an existing file (and heading), and every generated section has both markers."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import h5py

REPO = Path(__file__).resolve().parent.parent
README_MAX_LINES = 250

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(`+).+?\1", re.DOTALL)
# [text](target) and ![alt](target), with an optional "title"; the target has no spaces
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
MARKER = re.compile(r"<!-- ([\w-]+):(start|end) -->")
# "439 tests pass", "12 passed", "1 is skipped", "2 slow ones are deselected"
TEST_COUNT = re.compile(
    r"\b\d[\d,]*\s+(?:[\w-]+\s+){0,2}?tests\b"
    r"|\b\d[\d,]*\s+(?:[\w-]+\s+){0,3}?(?:passed|failed|skipped|deselected|xfailed|xpassed)\b",
    re.IGNORECASE,
)


def pages(root: Path) -> list[Path]:
    """README.md and the Markdown pages of docs/."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def prose(text: str) -> str:
    """`text` without fenced code blocks and code spans (links there are not links)."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text without formatting, lower case, punctuation
    dropped, spaces as hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = text.replace("`", "").replace("*", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of the headings of the Markdown file `path` (repeats get -1, -2 ...)."""
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text(encoding="utf-8"))):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(root: Path) -> list[str]:
    """`page: target (why)` for every relative link of README.md and docs/*.md that reaches no
    file, leaves the repository, or names a heading that the file does not have."""
    root = root.resolve()
    broken = []
    for page in pages(root):
        for target in LINK.findall(prose(page.read_text(encoding="utf-8"))):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
                continue  # https:, mailto: ...
            name = f"{page.relative_to(root)}: {target}"
            file_part, _, anchor = target.partition("#")
            path = (page.parent / file_part).resolve() if file_part else page
            if not path.is_relative_to(root):
                broken.append(f"{name} (outside the repository)")
            elif not path.exists():
                broken.append(f"{name} (no such file)")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                broken.append(f"{name} (no such heading)")
    return broken


def stated_test_counts(root: Path) -> list[str]:
    """`page:line: text` for every statement of how many tests pass, fail or are skipped."""
    found = []
    for page in pages(root):
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            found += [f"{page.relative_to(root)}:{number}: {m}" for m in TEST_COUNT.findall(line)]
    return found


def unpaired_markers(root: Path) -> list[str]:
    """`page: name` for every generated section whose markers are not one start then one end."""
    unpaired = []
    for page in pages(root):
        found = MARKER.findall(page.read_text(encoding="utf-8"))
        for name in dict.fromkeys(name for name, _ in found):
            if [kind for other, kind in found if other == name] != ["start", "end"]:
                unpaired.append(f"{page.relative_to(root)}: {name}")
    return unpaired


def test_readme_is_a_front_door():
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move the detail to docs/"
    )
    text = "\n".join(lines)
    for page in sorted((REPO / "docs").glob("*.md")):
        if page.name != "API.md":  # generated, linked from usage.md
            assert f"(docs/{page.name})" in text, f"README.md does not link docs/{page.name}"


def test_no_page_states_a_test_count():
    assert stated_test_counts(REPO) == []


def test_every_relative_link_reaches_a_file():
    assert broken_links(REPO) == []


def test_every_generated_section_has_both_markers():
    assert unpaired_markers(REPO) == []


def test_the_checks_find_what_they_look_for(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "usage.md").write_text("# Usage\n\n## The `elmo` component\n")
    (tmp_path / "README.md").write_text(
        "# x\n\n"
        "[usage](docs/usage.md), [component](docs/usage.md#the-elmo-component),\n"
        "[top](#x), [site](https://example.org/a.md), `[code](not/checked.md)`\n\n"
        "```\n[code](not/checked/either.md)\n```\n\n"
        "[missing](docs/cli.md), ![plot](docs/plot.png), [heading](docs/usage.md#gpu),\n"
        "[up](../outside.md), [self](#nowhere)\n\n"
        "The suite takes 2 minutes (439 tests pass, 1 is skipped, 2 slow ones are deselected).\n"
        "<!-- evidence:start -->\n<!-- probes:end -->\n<!-- probes:start -->\n"
    )
    assert broken_links(tmp_path) == [
        "README.md: docs/cli.md (no such file)",
        "README.md: docs/plot.png (no such file)",
        "README.md: docs/usage.md#gpu (no such heading)",
        "README.md: ../outside.md (outside the repository)",
        "README.md: #nowhere (no such heading)",
    ]
    assert stated_test_counts(tmp_path) == [
        "README.md:13: 439 tests",
        "README.md:13: 1 is skipped",
        "README.md:13: 2 slow ones are deselected",
    ]
    assert unpaired_markers(tmp_path) == ["README.md: evidence", "README.md: probes"]
    assert slug("Any ELMo in any pipeline: `spacy-elmo init-config`") == (
        "any-elmo-in-any-pipeline-spacy-elmo-init-config"
    )
    assert slug("Does ELMo pay for itself? Learning curves on CoNLL-2003") == (
        "does-elmo-pay-for-itself-learning-curves-on-conll-2003"
    )


def test_quick_start_3_runs_on_the_shipped_examples(tmp_path):
    """Quick start 3's commands, run as written in a folder that has only examples/: one
    dataset a line of each input, every layer (3, n, 256) or the layer average (n, 256)."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Quick start 3") :]
    (block,) = re.findall(r"```bash\n(.*?)```", section[: section.index("\n## ", 1)], re.S)
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    outputs = {}
    for line in block.splitlines():
        args = shlex.split(line, comments=True)
        assert args[:2] == ["spacy-elmo", "embed"], line
        command = [sys.executable, "-m", "spacy_elmo.cli", *args[1:], "--threads", "1"]
        environment = {**os.environ, "PYTHONPATH": str(REPO)}
        done = subprocess.run(
            command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, (line, done.stderr)
        outputs[args[3]] = (tmp_path / args[2], "--average" in args)
    assert len(outputs) == 2
    for output, (source, averaged) in outputs.items():
        lines = source.read_text(encoding="utf-8").splitlines()
        with h5py.File(tmp_path / output, "r") as written:
            lines_written = sorted((name for name in written if name.isdigit()), key=int)
            assert lines_written == [str(i) for i in range(len(lines))]
            for i, text in enumerate(lines):
                shape = written[str(i)].shape
                assert shape[-1] == 256 and (len(shape) == 2) == averaged, (output, shape)
                if not averaged:  # tokenised: one vector a whitespace-separated token
                    assert shape[:2] == (3, len(text.split()))
