"""Size limits that keep the project readable: the README and each docs page short, no module
of the package over 500 lines, the package no larger than today, and no test that edits
`sys.path` to import what it tests.
Code lines are counted as the lines a Python token other than a comment or a docstring covers
(blank lines, comment lines and docstrings left out)."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README_MAX_LINES = 200
PAGE_MAX_LINES = 350
PAGES_WITHOUT_LIMIT = ("API.md", "MODEL.md")  # generated; the model section by section
MODULE_MAX_LINES = 500
# The package's limits (12,230 lines, 8,953 of code on 2026-12-07): it may not grow past them.
PACKAGE_MAX_LINES = 12_500
PACKAGE_MAX_CODE_LINES = 9_000
PATH_EDIT = re.compile(r"sys\.path\.(insert|append|extend)|sys\.path\s*[+]?=")
LAYOUT_TOKENS = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENCODING,
    tokenize.ENDMARKER,
}


def line_count(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def docstring_lines(tree: ast.AST) -> set[int]:
    """The line numbers of the module's, classes' and functions' docstrings."""
    lines: set[int] = set()
    scopes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    for node in ast.walk(tree):
        if isinstance(node, scopes) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                if isinstance(first.value.value, str):
                    lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def code_lines(source: str) -> int:
    """How many lines of `source` hold code: not blank, not only a comment, not a docstring."""
    covered: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in LAYOUT_TOKENS:
            covered.update(range(token.start[0], token.end[0] + 1))
    return len(covered - docstring_lines(ast.parse(source)))


def long_pages(root: Path) -> list[str]:
    """`page: lines` for README.md over 200 lines and each docs/*.md page over 350."""
    found = []
    if line_count(root / "README.md") > README_MAX_LINES:
        found.append(f"README.md: {line_count(root / 'README.md')}")
    for page in sorted((root / "docs").rglob("*.md")):
        if page.name not in PAGES_WITHOUT_LIMIT and line_count(page) > PAGE_MAX_LINES:
            found.append(f"{page.relative_to(root)}: {line_count(page)}")
    return found


def long_modules(root: Path) -> list[str]:
    """`module: lines` for each module of spacy_elmo over 500 lines."""
    modules = sorted((root / "spacy_elmo").rglob("*.py"))
    return [
        f"{path.relative_to(root)}: {line_count(path)}"
        for path in modules
        if line_count(path) > MODULE_MAX_LINES
    ]


def package_size(root: Path) -> tuple[int, int]:
    """Lines and code lines of all the modules of spacy_elmo."""
    modules = sorted((root / "spacy_elmo").rglob("*.py"))
    lines = sum(line_count(path) for path in modules)
    code = sum(code_lines(path.read_text(encoding="utf-8")) for path in modules)
    return lines, code


def sys_path_edits(root: Path) -> list[str]:
    """`file:line` of every `sys.path` edit in the Python files of tests/."""
    found = []
    for path in sorted((root / "tests").rglob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if PATH_EDIT.search(line):
                found.append(f"{path.relative_to(root)}:{number}")
    return found


def test_pages_are_short():
    assert long_pages(REPO) == [], "move lab detail to docs/research/ or cut repetition"


def test_modules_are_short():
    assert long_modules(REPO) == [], "split the module along one idea per file"


def test_the_package_does_not_grow():
    lines, code = package_size(REPO)
    assert lines <= PACKAGE_MAX_LINES, f"{lines} lines: simplify before adding"
    assert code <= PACKAGE_MAX_CODE_LINES, f"{code} code lines: simplify before adding"


def test_no_test_edits_sys_path():
    assert sys_path_edits(REPO) == [], "run the code as a module or through PYTHONPATH"


def test_the_counts_find_what_they_look_for(tmp_path):
    (tmp_path / "docs" / "research").mkdir(parents=True)
    (tmp_path / "spacy_elmo").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "README.md").write_text("x\n" * 201)
    (tmp_path / "docs" / "API.md").write_text("x\n" * 900)
    (tmp_path / "docs" / "usage.md").write_text("x\n" * 350)
    (tmp_path / "docs" / "research" / "speed.md").write_text("x\n" * 351)
    (tmp_path / "spacy_elmo" / "big.py").write_text("x = 1\n" * 501)
    (tmp_path / "spacy_elmo" / "small.py").write_text("x = 1\n" * 500)
    (tmp_path / "tests" / "test_x.py").write_text("import sys\nsys.path" + ".insert(0, 'x')\n")
    assert long_pages(tmp_path) == ["README.md: 201", "docs/research/speed.md: 351"]
    assert long_modules(tmp_path) == ["spacy_elmo/big.py: 501"]
    assert sys_path_edits(tmp_path) == ["tests/test_x.py:2"]
    source = (
        '"""Module\ndocstring."""\n\n# a comment\n'
        "def f(x):\n"
        '    """One line."""\n'
        "    text = '''a\n    b'''  # code, with a comment\n"
        "    return (x,\n            1)\n"
    )
    assert code_lines(source) == 5  # def, the two lines of text, the two of return
    (tmp_path / "spacy_elmo" / "f.py").write_text(source)
    assert package_size(tmp_path) == (501 + 500 + 10, 501 + 500 + 5)
