"""`spacy-elmo init-config`: valid, complete configs that train."""

from __future__ import annotations

import io
import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import spacy
from spacy.cli import app as spacy_app
from spacy.tokens import Doc, DocBin, Span
from spacy.training.initialize import init_nlp
from spacy.training.loop import train
from spacy.util import load_config
from typer.testing import CliRunner

from spacy_elmo.cli import app
from spacy_elmo.pipeline.init_config import COMPONENTS

from .pipeline_util import REPO, TINY_WIDTH

ALL = list(COMPONENTS)  # all 8, trained together in one pipeline
# (words, tag, pos, morph, lemma, entity label)
SUBJECTS = [
    ([("Anna", "NNP", "PROPN", "Number=Sing", "Anna")], "PERSON"),
    ([("Berlin", "NNP", "PROPN", "Number=Sing", "Berlin")], "GPE"),
    ([("the", "DT", "DET", "Definite=Def|PronType=Art", "the"),
      ("bank", "NN", "NOUN", "Number=Sing", "bank")], None),
]  # fmt: skip
VERBS = [
    ("visited", "VBD", "VERB", "Tense=Past|VerbForm=Fin", "visit"),
    ("likes", "VBZ", "VERB", "Number=Sing|Person=3|Tense=Pres|VerbForm=Fin", "like"),
]
OBJECTS = [
    ([("Paris", "NNP", "PROPN", "Number=Sing", "Paris")], "GPE"),
    ([("Ben", "NNP", "PROPN", "Number=Sing", "Ben")], "PERSON"),
]
PERIOD = (".", ".", "PUNCT", "PunctType=Peri", ".")


def gold_doc(vocab, rng: random.Random, n_sentences: int = 2) -> Doc:
    """Sentences with tags, POS, morphs, lemmas, dependencies, entities, spans and cats."""
    rows, heads, deps, ents = [], [], [], []
    for _ in range(n_sentences):
        (subject, s_label), verb, (obj, o_label) = (
            rng.choice(SUBJECTS),
            rng.choice(VERBS),
            rng.choice(OBJECTS),
        )
        start = len(rows)
        verb_i = start + len(subject)
        for i in range(len(subject)):
            is_head = i == len(subject) - 1
            heads.append(verb_i if is_head else start + len(subject) - 1)
            deps.append("nsubj" if is_head else "det")
        heads.append(verb_i)
        deps.append("ROOT")
        heads += [verb_i] * (len(obj) + 1)
        deps += ["dobj"] * len(obj) + ["punct"]
        rows += [*subject, verb, *obj, PERIOD]
        ents += _iob(subject, s_label) + ["O"] + _iob(obj, o_label) + ["O"]
    words, tags, pos, morphs, lemmas = (list(column) for column in zip(*rows))
    doc = Doc(vocab, words=words, tags=tags, pos=pos, morphs=morphs, lemmas=lemmas,
              heads=heads, deps=deps, ents=ents)  # fmt: skip
    doc.spans["sc"] = [Span(doc, e.start, e.end, e.label_) for e in doc.ents]
    person_first = doc.ents[0].label_ == "PERSON" if doc.ents else False
    doc.cats = {"PERSON_FIRST": float(person_first), "OTHER": float(not person_first)}
    return doc


def _iob(tokens, label):
    if label is None:
        return ["O"] * len(tokens)
    return [f"B-{label}"] + [f"I-{label}"] * (len(tokens) - 1)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    directory = tmp_path_factory.mktemp("corpus")
    vocab = spacy.blank("en").vocab
    rng = random.Random(0)
    paths = []
    for name, n in (("train", 16), ("dev", 4)):
        DocBin(docs=[gold_doc(vocab, rng) for _ in range(n)]).to_disk(directory / f"{name}.spacy")
        paths.append(directory / f"{name}.spacy")
    return paths


def init_config(path, *args):
    result = CliRunner().invoke(app, ["init-config", str(path), *map(str, args)])
    assert result.exit_code == 0, result.output
    return path


def debug_config(path, corpus):
    overrides = ["--paths.train", str(corpus[0]), "--paths.dev", str(corpus[1])]
    return CliRunner().invoke(spacy_app, ["debug", "config", str(path), *overrides])


def test_every_component_trains_from_the_generated_config(tmp_path, bilm_dir, corpus):
    path = init_config(tmp_path / "config.cfg", "--components", ",".join(ALL), "--model", bilm_dir)
    result = debug_config(path, corpus)
    assert result.exit_code == 0, result.output
    assert "Config is valid" in result.output
    config = load_config(path, interpolate=False)
    assert config["nlp"]["pipeline"] == ["elmo", *ALL]
    assert config["initialize"]["components"]["elmo"]["weights"]["path"] == "${paths.elmo_model}"
    for name in ALL:  # each component has its own listener and so its own mix
        tok2vec = config["components"][name]["model"]["tok2vec"]
        assert tok2vec["@architectures"] == "spacy_elmo.ElmoTok2Vec.v1"
        assert tok2vec["elmo"]["@architectures"] == "spacy_elmo.ElmoListener.v1"
        assert tok2vec["elmo"]["width"] is None
        # Small widths keep the test fast; the structure is the generated one.
        tok2vec["embed"].update(width=8, rows=[100, 50, 50, 50])
        tok2vec["encode"].update(width=8, depth=1)
    config["paths"].update(train=str(corpus[0]), dev=str(corpus[1]))
    config["training"].update(max_steps=4, eval_frequency=2)
    config["training"]["batcher"]["size"] = 200

    nlp = init_nlp(config)
    elmo = nlp.get_pipe("elmo")
    assert sorted(elmo.listening_components) == sorted(ALL)
    (tmp_path / "out").mkdir()
    log = io.StringIO()
    train(nlp, tmp_path / "out", stdout=log, stderr=io.StringIO())
    for name in ALL:  # a loss column per component (spaCy cuts long headers at 13 characters)
        assert f"LOSS {name.upper()}"[:10] in log.getvalue(), name
    trained = nlp.config
    for name in ALL:
        assert trained["components"][name]["model"]["tok2vec"]["elmo"]["width"] == TINY_WIDTH
    saved = json.loads((bilm_dir / "config.json").read_text())["options"]
    assert trained["components"]["elmo"]["model"]["lstm_dim"] == saved["lstm"]["dim"]
    loaded = spacy.load(tmp_path / "out" / "model-last")
    text = "Anna visited Paris. The bank likes Ben."
    a, b = nlp(text), loaded(text)
    assert [t.tag_ for t in a] == [t.tag_ for t in b]
    assert [t.dep_ for t in a] == [t.dep_ for t in b]
    assert a.cats == pytest.approx(b.cats, abs=1e-6)
    assert_elmo_behind_vectors([loaded(text) for text in BANKS])
    # n_process, and a pipeline made a package by spaCy
    assert_elmo_behind_vectors(list(loaded.pipe(BANKS, n_process=2)), hooks=False)
    packaged = package(tmp_path / "out" / "model-last", tmp_path / "packages")
    assert_elmo_behind_vectors([spacy.load(packaged)(text) for text in BANKS])


BANKS = ["The river bank flooded .", "The investment bank lent money ."]


def assert_elmo_behind_vectors(docs, hooks: bool = True) -> None:
    """A pipeline trained from `init-config`'s default config has ELMo behind `.vector` (the
    top layer, as `doc.tensor` where the hooks are lost) and, with its hooks, behind
    `.similarity`: "bank" and "bank" get the cosine of their top layers, not spaCy's 1.0."""
    river, money = docs
    top_river, top_money = river._.elmo_layers[-1], money._.elmo_layers[-1]
    assert river.vector.shape == (TINY_WIDTH,)
    np.testing.assert_allclose(river[2].vector, top_river[2], atol=1e-6)
    np.testing.assert_allclose(money.vector, top_money.mean(0), atol=1e-5)
    a, b = top_river[2].astype("float64"), top_money[2].astype("float64")
    cosine = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
    assert cosine < 0.9999
    if hooks:  # a doc read from bytes gets them from set_vector_hooks (test_vectors.py)
        assert river[2].similarity(money[2]) == pytest.approx(cosine, rel=1e-5)


def package(model: Path, output: Path) -> Path:
    """`spacy package` of `model` (no build): the packaged pipeline's data directory."""
    output.mkdir()
    command = [sys.executable, "-m", "spacy", "package", str(model), str(output)]
    command += ["--name", "elmo_test", "--version", "0.0.1", "--build", "none"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (data,) = output.glob("*/*/*-0.0.1")
    return data


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["--for-gpu", "--fine-tune"],
        ["--vectors", "en_core_web_md", "--no-split-sentences"],
        ["--allennlp"],
        ["--no-vector-hooks"],
        ["--vectors", "en_core_web_md", "--vector-hooks"],
    ],
)
def test_generated_configs_pass_spacy_debug_config(tmp_path, corpus, allennlp_fixture, extra):
    if extra == ["--allennlp"]:
        extra = ["--options", allennlp_fixture / "options.json"]
        extra += ["--weights", allennlp_fixture / "lm_weights.hdf5"]
    path = init_config(tmp_path / "config.cfg", "-p", "ner,textcat", *extra)
    result = debug_config(path, corpus)
    assert result.exit_code == 0, result.output
    config = load_config(path, interpolate=False)
    elmo = config["components"]["elmo"]["model"]
    assert elmo["frozen"] is ("--fine-tune" not in extra)
    split = config["components"]["elmo"]["split_sentences"]
    assert split is ("--no-split-sentences" not in extra)
    # ELMo behind .vector: on unless static vectors are there or a flag says otherwise
    hooks = "--vector-hooks" in extra or (
        "--vectors" not in extra and "--no-vector-hooks" not in extra
    )
    assert config["components"]["elmo"]["vector_hooks"] is hooks
    assert config["system"]["gpu_allocator"] == ("pytorch" if "--for-gpu" in extra else None)
    tok2vec = config["components"]["ner"]["model"]["tok2vec"]
    assert tok2vec["embed"]["include_static_vectors"] is ("--vectors" in extra)
    assert tok2vec["@architectures"] == "spacy_elmo.ElmoTok2Vec.v1"
    if "--vectors" in extra:
        assert config["paths"]["vectors"] == "en_core_web_md"
    if "--options" in extra:
        weights = config["initialize"]["components"]["elmo"]["weights"]
        assert weights["@misc"] == "spacy_elmo.AllenNLPWeights.v1"
        assert config["paths"]["elmo_weights"] == str(allennlp_fixture / "lm_weights.hdf5")
    else:
        assert "elmo" not in config["initialize"]["components"]  # the bundled biLM


@pytest.mark.parametrize(
    "args, message",
    [
        (["-p", "tagger,sentiment"], "unknown components ['sentiment']"),
        (["--options", "x.json"], "options file needs its weights file too"),
        (["--model", "/nonexistent"], "biLM /nonexistent does not exist"),
    ],
)
def test_bad_arguments_are_clear_errors(tmp_path, args, message):
    result = CliRunner().invoke(app, ["init-config", str(tmp_path / "c.cfg"), *args])
    assert result.exit_code == 1
    assert message in result.output


def test_existing_file_needs_force(tmp_path):
    path = tmp_path / "c.cfg"
    path.write_text("keep")
    result = CliRunner().invoke(app, ["init-config", str(path), "-p", "ner"])
    assert result.exit_code == 1 and path.read_text() == "keep"
    init_config(path, "-p", "ner", "--force")
    assert load_config(path)["nlp"]["pipeline"] == ["elmo", "ner"]


def test_every_listed_component_is_documented_in_the_help():
    result = CliRunner().invoke(app, ["init-config", "--help"], env={"COLUMNS": "200"})
    for name in COMPONENTS:
        assert name in result.output


def test_documented_commands(tmp_path, monkeypatch):
    """docs/usage.md's published-model table and its commands agree with
    the options of those shapes: parameters and output width as the written config reports."""
    import re
    import shlex

    from spacy_elmo.pretrain.presets import preset

    text = (REPO / "docs" / "usage.md").read_text()
    row = r"^\| (Small|Medium|Original(?: \(5\.5B\))?) \| ([\d.]+)M \| (\d+) \| `(\S+)` \|$"
    rows = re.findall(row, text, flags=re.M)
    commands = [line for line in text.splitlines() if line.startswith("spacy-elmo init-config")]
    assert len(rows) == 4
    shapes = {"Small": "small", "Medium": "medium", "Original": "original"}
    monkeypatch.chdir(tmp_path)
    for model, parameters, width, name in rows:
        (command,) = [c for c in commands if f"--options {name}_options.json " in c]
        (tmp_path / f"{name}_options.json").write_text(
            json.dumps(preset(shapes[model[:8].strip()]))
        )
        (tmp_path / f"{name}_weights.hdf5").write_bytes(b"")  # only its existence is checked
        args = shlex.split(command)[1:] + ["--force"]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        header = (tmp_path / "config.cfg").read_text().splitlines()[1]
        assert f"{parameters}M parameters, 3 layers of width {width} " in header, (model, header)
