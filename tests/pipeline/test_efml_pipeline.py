"""Non-English pipelines: an ELMoForManyLangs model in spaCy, and pretraining on non-Latin text.

The ELMoForManyLangs model is a tiny random-weight directory in their layout
(`tests/weights/efml_reference.py`); the expected vectors come from the independent NumPy
re-implementation of their forward pass in that module.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import warnings
from pathlib import Path

import numpy
import pytest
import spacy
from spacy.tokens import Doc, DocBin
from spacy.training.initialize import init_nlp
from spacy.training.loop import train
from spacy.util import load_model_from_config
from typer.testing import CliRunner

from spacy_elmo import BiLM
from spacy_elmo.cli import app
from spacy_elmo.pipeline.component import ElmoUnusedWarning

from ..weights.efml_reference import (
    architecture,
    dictionaries,
    read_dic,
    reference_layers,
    write_model,
)
from .pipeline_util import listening_tagger_config

TRAINING_TEXT = [
    ["Der", "Hund", "läuft", "schnell", "."],
    ["Die", "Katze", "schläft", "im", "Garten", "."],
    ["Ein", "Vogel", "singt", "."],
]
WEIGHTS = {"@misc": "spacy_elmo.ElmoForManyLangsWeights.v1"}
LANGUAGES_PAGE = Path(__file__).resolve().parents[2] / "docs" / "languages.md"


@pytest.fixture(scope="module")
def efml_model(tmp_path_factory):
    arch = architecture(5)
    chars, words = dictionaries(TRAINING_TEXT)
    directory = tmp_path_factory.mktemp("efml") / "de.model"
    weights = write_model(directory, arch, chars, words, seed=3)
    return directory, arch, weights


def german_nlp(model_dir) -> spacy.Language:
    nlp = spacy.blank("de")
    nlp.add_pipe("elmo")
    nlp.config["initialize"]["components"]["elmo"] = {
        "weights": {**WEIGHTS, "path": str(model_dir)}
    }
    return nlp


def test_german_pipeline_gives_their_vectors_and_survives_to_disk(efml_model, tmp_path):
    directory, arch, weights = efml_model
    nlp = german_nlp(directory)
    nlp.initialize()
    text = "Der Vogel läuft im Garten über die Brücke."
    doc = nlp(text)
    words = [t.text for t in doc]
    assert words[-1] == "." and "über" in words
    char2id, word2id = read_dic(directory / "char.dic"), read_dic(directory / "word.dic")
    expected = reference_layers(weights, arch, words, char2id, word2id)
    assert doc._.elmo_layers.shape == (3, len(words), 12)
    numpy.testing.assert_allclose(doc._.elmo_layers, expected, atol=1e-5, rtol=0)

    nlp.to_disk(tmp_path / "pipeline")
    loaded = spacy.load(tmp_path / "pipeline")
    assert loaded.lang == "de"
    again = loaded(text)
    numpy.testing.assert_array_equal(again._.elmo_layers, doc._.elmo_layers)
    # The saved pipeline needs only its directory: no ELMoForManyLangs files, no pickle.
    saved = sorted(p.name for p in (tmp_path / "pipeline" / "elmo").iterdir())
    assert not any(name.endswith((".pkl", ".dic")) for name in saved)


def test_the_languages_page_snippet_runs_without_warnings(efml_model, tmp_path, monkeypatch):
    """The Python block of docs/languages.md's "In a pipeline" runs as written on a model
    directory `de.model`, with no ElmoUnusedWarning, and leaves a pipeline spacy.load reads."""
    section = LANGUAGES_PAGE.read_text().split("## In a pipeline", 1)[1]
    (snippet,) = re.findall(r"^```python\n(.*?)^```", section, re.MULTILINE | re.DOTALL)[:1]
    shutil.copytree(efml_model[0], tmp_path / "de.model")
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ElmoUnusedWarning)
        exec(compile(snippet, str(LANGUAGES_PAGE), "exec"), {})
    assert spacy.load(tmp_path / "de_elmo")("Der Hund läuft.")._.elmo_layers.shape[0] == 3


TAGGED = [
    (["Der", "Hund", "läuft", "."], ["ART", "NN", "VVFIN", "$."]),
    (["Die", "Katze", "schläft", "."], ["ART", "NN", "VVFIN", "$."]),
    (["Ein", "Vogel", "singt", "."], ["ART", "NN", "VVFIN", "$."]),
]


def test_spacy_train_a_german_tagger_on_efml_vectors(efml_model, tmp_path):
    directory, _, _ = efml_model
    blank = spacy.blank("de")
    paths = {}
    for name, copies in (("train", 4), ("dev", 1)):
        docs = [Doc(blank.vocab, words=w, tags=t) for w, t in TAGGED * copies]
        paths[name] = tmp_path / f"{name}.spacy"
        DocBin(docs=docs).to_disk(paths[name])
    weights = {**WEIGHTS, "path": str(directory)}
    config = listening_tagger_config(
        "de", weights, paths["train"], paths["dev"], steps=6, batch_size=4
    )
    filled = load_model_from_config(config, auto_fill=True).config
    nlp = init_nlp(filled)
    (tmp_path / "out").mkdir()
    train(nlp, tmp_path / "out", stdout=io.StringIO(), stderr=io.StringIO())
    assert nlp.config["components"]["elmo"]["model"]["projection_dim"] == 6
    loaded = spacy.load(tmp_path / "out" / "model-last")
    reference = BiLM.from_elmoformanylangs(directory)
    for words, _ in TAGGED:
        doc = loaded(Doc(loaded.vocab, words=words))
        numpy.testing.assert_allclose(
            doc._.elmo_layers, reference.embed([words])[0], atol=1e-6, rtol=0
        )
        assert all(t.tag_ for t in doc)


def test_cli_embed_reads_an_efml_directory(efml_model, tmp_path):
    import h5py

    directory, arch, weights = efml_model
    text = tmp_path / "input.txt"
    text.write_text("Der Hund läuft .\nEin Vogel singt schnell .\n", encoding="utf-8")
    out = tmp_path / "out.hdf5"
    result = CliRunner().invoke(app, ["embed", str(text), str(out), "--model", str(directory)])
    assert result.exit_code == 0, result.output
    char2id, word2id = read_dic(directory / "char.dic"), read_dic(directory / "word.dic")
    with h5py.File(out, "r") as hdf5:
        first = hdf5["0"][...]
    expected = reference_layers(weights, arch, ["Der", "Hund", "läuft", "."], char2id, word2id)
    numpy.testing.assert_allclose(first, expected, atol=1e-5, rtol=0)


NON_LATIN = [
    "Мама мыла раму .",
    "Кошка спит на окне .",
    "Собака бежит по улице .",
    "我 喜欢 自然 语言 处理 。",
    "今天 天气 很 好 。",
    "他 在 北京 工作 。",
]


def test_pretrain_on_cyrillic_and_cjk_loads_back_and_embeds(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(NON_LATIN * 20) + "\n", encoding="utf-8")
    run = tmp_path / "run"
    args = [
        "pretrain", str(corpus), str(run), "--preset", "tiny", "--pretokenized",
        "--vocab-size", "100", "--min-count", "1", "--max-steps", "8", "--batch-tokens", "128",
        "--lr", "0.01", "--warmup-steps", "2", "--eval-every", "4", "--checkpoint-every", "4",
        "--log-every", "4", "--threads", "1",
    ]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = json.loads((run / "model" / "pretrain.json").read_text())
    assert summary["steps"] == 8
    vocab = (run / "model" / "vocab.txt").read_text(encoding="utf-8").split("\n")
    assert "Мама" in vocab and "语言" in vocab
    bilm = BiLM.load(run / "model")
    sentences = [line.split() for line in NON_LATIN]
    layers = bilm.embed(sentences)
    for sentence, vectors in zip(sentences, layers):
        assert vectors.shape == (bilm.options.n_layers + 1, len(sentence), 2 * 16)
        assert numpy.isfinite(vectors).all()
    # Different scripts give different token vectors (the bytes reach the char CNN).
    assert numpy.abs(layers[0][0, 0] - layers[3][0, 0]).max() > 1e-3
