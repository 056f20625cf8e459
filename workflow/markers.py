"""Generated sections of the docs pages: the text between `<!-- NAME:start -->` and
`<!-- NAME:end -->`, rewritten by the workflow command that made it."""

from __future__ import annotations

import warnings
from pathlib import Path


def markers(name: str) -> tuple[str, str]:
    """The start and end markers of section `name`."""
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


def replace_between_markers(path: Path, name: str, content: str) -> bool:
    """Put `content` between the markers of section `name` in `path`; False (with a warning,
    the file left as it is) if the file has no such markers."""
    start_marker, end_marker = markers(name)
    text = path.read_text()
    start, end = text.find(start_marker), text.find(end_marker)
    if start < 0 or end < start:
        warnings.warn(
            f"{path} has no {start_marker} ... {end_marker} markers; left as it is",
            stacklevel=2,
        )
        return False
    head = text[: start + len(start_marker)]
    updated = head + "\n" + content.strip("\n") + "\n" + text[end:]
    if updated != text:
        path.write_text(updated)
    return True
