"""How to install what an optional feature needs: the requirement as spacy-elmo's extra
declares it (setup.cfg, read back from the installed package's metadata), and the extra for a
clone of the source:

    pip install 'ray>=2.60,<3' (in a clone of spacy-elmo's source: pip install -e '.[ray]')
"""

from __future__ import annotations

from importlib import metadata

from packaging.requirements import Requirement


def install_hint(extra: str, *names: str) -> str:
    """pip's command for `names` with the ranges that the extra `extra` gives them (lower
    bounds first; the bare names where spacy-elmo is not installed), and the extra's."""
    try:
        declared = [Requirement(line) for line in metadata.requires("spacy-elmo") or []]
    except metadata.PackageNotFoundError:
        declared = []
    ranges = {
        r.name.lower(): sorted(map(str, r.specifier), key=lambda s: (not s.startswith(">"), s))
        for r in declared
        if r.marker is not None and r.marker.evaluate({"extra": extra})
    }
    wanted = " ".join(f"'{name}{','.join(ranges.get(name.lower(), []))}'" for name in names)
    return f"pip install {wanted} (in a clone of spacy-elmo's source: pip install -e '.[{extra}]')"
