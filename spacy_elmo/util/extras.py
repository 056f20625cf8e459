"""How to install what an optional feature needs, read from spacy-elmo's own metadata.

An extra's requirements are declared once, in setup.cfg's `[options.extras_require]`; the
installed package's metadata carries them (`Requires-Dist: ray<3,>=2.60; extra == "ray"`), and
a hint names the requirement itself, which installs whatever way spacy-elmo was installed, and
the extra for a clone of the source:

    pip install 'ray>=2.60,<3' (in a clone of spacy-elmo's source: pip install -e '.[ray]')
"""

from __future__ import annotations

import configparser
from importlib import metadata
from pathlib import Path
from typing import Optional

from packaging.requirements import Requirement

DISTRIBUTION = "spacy-elmo"
# setup.cfg of a source checkout, for a package that is imported from it without being installed
SETUP_CFG = Path(__file__).resolve().parents[2] / "setup.cfg"


def requirement(extra: str, name: str) -> str:
    """`name`'s requirement in spacy-elmo's extra `extra`, lower bounds first: 'ray>=2.60,<3'.
    LookupError when the extra does not require `name`."""
    for line in _extra_requirements(extra):
        parsed = Requirement(line)
        if parsed.name.lower() == name.lower():
            specifiers = sorted(
                parsed.specifier, key=lambda s: (not s.operator.startswith(">"), str(s))
            )
            return parsed.name + ",".join(str(s) for s in specifiers)
    raise LookupError(f"the extra [{extra}] of {DISTRIBUTION} does not require {name}")


def install_hint(extra: str, *names: str) -> str:
    """pip's command for `names` (the requirements of extra `extra`), and the extra's for a
    source checkout: "pip install 'ray>=2.60,<3' (in a clone of spacy-elmo's source: pip
    install -e '.[ray]')"."""
    wanted = " ".join(f"'{requirement(extra, name)}'" for name in names)
    return (
        f"pip install {wanted} (in a clone of {DISTRIBUTION}'s source: pip install -e '.[{extra}]')"
    )


def _extra_requirements(extra: str) -> list[str]:
    """The requirements of `extra` without their markers: the installed metadata's, else (run
    from a source checkout that is not installed) setup.cfg's."""
    installed = _installed_requires()
    if installed is not None:
        found = []
        for line in installed:
            parsed = Requirement(line)
            if parsed.marker is not None and parsed.marker.evaluate({"extra": extra}):
                parsed.marker = None
                found.append(str(parsed))
        return found
    parser = configparser.ConfigParser()
    parser.read(SETUP_CFG, encoding="utf-8")
    text = parser.get("options.extras_require", extra, fallback="")
    return [line.split("#")[0].strip() for line in text.splitlines() if line.split("#")[0].strip()]


def _installed_requires() -> Optional[list[str]]:
    try:
        return metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return None
