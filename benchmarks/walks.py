"""How straight the package's main walks go: for `BiLM.load("bundled")`, one `embed` call on a
warm biLM and one `nlp(text)` of a blank pipeline with `elmo`, the package files whose
functions are called and the calls that enter a file left before (calls within one file count
once), from `sys.setprofile`'s call events; and how many BiLMs the load builds.

    python -m benchmarks.walks
"""

from __future__ import annotations

import json
import os
import sys
from typing import Callable

import spacy_elmo
from spacy_elmo import BiLM

PACKAGE = os.path.dirname(spacy_elmo.__file__)


def walk(run: Callable[[], object]) -> dict:
    """The files `run` calls into, in order (a file again each time it is entered anew)."""
    route: list[str] = []
    builds = 0

    def profile(frame, event, arg) -> None:
        nonlocal builds
        if event != "call" or not frame.f_code.co_filename.startswith(PACKAGE):
            return
        name = os.path.relpath(frame.f_code.co_filename, PACKAGE)
        if not route or route[-1] != name:
            route.append(name)
        if frame.f_code.co_name == "__init__" and type(frame.f_locals.get("self")) is BiLM:
            builds += 1

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    files = len(set(route))
    return {"files": files, "returns": len(route) - files, "bilm_inits": builds, "route": route}


def main() -> None:
    import spacy

    load = walk(lambda: BiLM.load("bundled"))
    bilm = BiLM.load("bundled")
    bilm.embed([["warm", "up"]])
    embed = walk(lambda: bilm.embed([["The", "cat", "sat", "."], ["Hello", "world"]]))
    nlp = spacy.blank("en")
    nlp.add_pipe("elmo")
    nlp("warm up the pipeline")
    pipeline = walk(lambda: nlp("The river bank overflowed after heavy rain"))
    for name, result in (("load", load), ("embed", embed), ("nlp", pipeline)):
        print(json.dumps({name: result}))


if __name__ == "__main__":
    main()
