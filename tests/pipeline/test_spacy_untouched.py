"""spacy-elmo leaves spaCy and Thinc as they are: in a fresh process, every module its entry
points name is imported, `elmo` components with and without vector hooks are built and run
(`nlp(text)`, `nlp.pipe`, a DocBin, `set_vector_hooks`), and spaCy's and Thinc's classes still
hold their own attributes (identity of every entry of `vars()` against what it held before the
import). What a built component adds: its extensions, through `Doc.set_extension` and the
like, and the msgpack encoder of GPU arrays; no fork hook, and `nlp.pipe` stays spaCy's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .pipeline_util import TINY_MODEL_CONFIG

REPO = Path(__file__).resolve().parents[2]

FRESH_PROCESS = r"""
import configparser, importlib, json, os, sys

fork_hooks = []  # what is registered with os.register_at_fork from now on
register_at_fork = os.register_at_fork


def recording_register_at_fork(**hooks):
    fork_hooks.extend(f"{f.__module__}.{f.__qualname__}" for f in hooks.values())
    register_at_fork(**hooks)


os.register_at_fork = recording_register_at_fork

import spacy
import srsly
from spacy.language import Language
from spacy.tokens import Doc, DocBin, Span, Token
from spacy.tokens.underscore import Underscore
from spacy.vocab import Vocab
from thinc.api import Model, PyTorchShim

CLASSES = (Language, DocBin, Doc, Span, Token, Underscore, Vocab, Model, PyTorchShim)
SPACY_PIPE, SPACY_GET_DOCS = Language.pipe, DocBin.get_docs
BEFORE = {cls: dict(vars(cls)) for cls in CLASSES}
ENCODERS = sorted(srsly.msgpack_encoders.get_all())
EXTENSIONS = [sorted(e) for e in (Underscore.doc_extensions, Underscore.token_extensions)]


def state(nlp=None):
    return {
        "replaced": sorted(
            f"{cls.__name__}.{name}"
            for cls in CLASSES
            for name in set(vars(cls)) | set(BEFORE[cls])
            if vars(cls).get(name) is not BEFORE[cls].get(name)
        ),
        "spacy_pipe": Language.pipe is SPACY_PIPE,
        "spacy_get_docs": DocBin.get_docs is SPACY_GET_DOCS,
        "new_encoders": sorted(set(srsly.msgpack_encoders.get_all()) - set(ENCODERS)),
        "fork_hooks": [hook for hook in fork_hooks if "spacy_elmo" in hook],
        "new_extensions": sorted(
            set(Underscore.doc_extensions) - set(EXTENSIONS[0])
            | set(Underscore.token_extensions) - set(EXTENSIONS[1])
        ),
        "nlp_pipe": None if nlp is None else type(vars(nlp).get("pipe", nlp.pipe)).__name__,
        "nlp_pipe_is_spacys": getattr(getattr(nlp, "pipe", None), "__func__", None) is SPACY_PIPE,
    }


config = configparser.ConfigParser()
config.read(os.path.join(sys.argv[1], "setup.cfg"))
modules = ["spacy_elmo"]
for group, lines in config["options.entry_points"].items():
    if group != "console_scripts":
        modules += [line.split("=")[1].split(":")[0].strip() for line in lines.split("\n") if line]
for module in dict.fromkeys(modules):
    importlib.import_module(module)
states = {"modules": modules, "imported": state()}

model = json.loads(sys.argv[2])
plain = spacy.blank("en")
plain.add_pipe("elmo", config={"model": model})
states["built"] = state(plain)
spacy.blank("en").add_pipe("elmo", config={"model": model})
states["built twice"] = state(plain)
hooked = spacy.blank("en")
hooked.add_pipe("elmo", config={"model": model, "vector_hooks": True})
states["hooked"] = state(hooked)
states["hooked, the other pipeline"] = state(plain)
from spacy_elmo.pipeline.extensions import set_vector_hooks

for vector_hooks in (False, True):  # the bundled biLM, run
    nlp = spacy.blank("en")
    nlp.add_pipe("elmo", config={"vector_hooks": vector_hooks})
    nlp.initialize()
    texts = ["the river bank", "the investment bank"]
    docs = [nlp(texts[0])] + list(nlp.pipe(texts, batch_size=1))
    for doc in DocBin(store_user_data=True, docs=docs).get_docs(nlp.vocab):
        doc[2]._.elmo, doc[1:3]._.elmo_layers
    docs[0][2].vector
set_vector_hooks(docs[0])
states["ran"] = state(nlp)
print(json.dumps(states))
"""

ELMO_EXTENSIONS = ["elmo", "elmo_layers", "elmo_mix_coefficients", "elmo_vector_layer"]
SPACY_FACTORIES = "Language.factories"
# what spaCy and Thinc rebind themselves: `Language.factory` when the `elmo` factory registers,
# Thinc's count of the models built
OWN_REBINDS = [SPACY_FACTORIES, "Model.global_id"]


@pytest.fixture(scope="module")
def states():
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    run = subprocess.run(
        [sys.executable, "-c", FRESH_PROCESS, str(REPO), json.dumps(TINY_MODEL_CONFIG)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=REPO,
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.splitlines()[-1])


def test_importing_the_package_changes_nothing_of_spacys(states):
    assert "spacy_elmo.pipeline.component" in states["modules"]
    assert "spacy_elmo.pipeline.loaders" in states["modules"]
    imported = states["imported"]
    # registering the `elmo` factory with spaCy's own `Language.factory` rebinds this one
    assert imported["replaced"] == [SPACY_FACTORIES]
    assert imported["spacy_pipe"] and imported["spacy_get_docs"]
    assert imported["new_encoders"] == []
    assert imported["fork_hooks"] == []
    assert imported["new_extensions"] == []


def test_an_elmo_without_hooks_changes_nothing_but_registers_what_its_docs_need(states):
    for built in (states["built"], states["built twice"]):
        assert built["replaced"] == OWN_REBINDS
        assert built["spacy_pipe"] and built["spacy_get_docs"]
        assert built["nlp_pipe"] == "method" and built["nlp_pipe_is_spacys"]
        # registered when the model is built, once
        assert built["new_encoders"] == ["spacy_elmo_cupy"]
        assert built["fork_hooks"] == []
        assert built["new_extensions"] == ELMO_EXTENSIONS


def test_an_elmo_with_hooks_changes_nothing_of_spacys_either(states):
    """Vector hooks are set on the docs the component annotates, not on spaCy: its classes,
    `nlp.pipe` and `DocBin.get_docs` stay spaCy's, also after running (test_vectors.py has
    what a doc read from bytes gets)."""
    for key in ("hooked", "hooked, the other pipeline", "ran"):
        built = states[key]
        assert built["replaced"] == OWN_REBINDS, key
        assert built["spacy_pipe"] and built["spacy_get_docs"], key
        assert built["nlp_pipe"] == "method" and built["nlp_pipe_is_spacys"], key
        assert built["fork_hooks"] == [], key
        assert built["new_extensions"] == ELMO_EXTENSIONS, key
