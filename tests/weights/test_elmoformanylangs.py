"""ELMoForManyLangs models: loaded exactly (against their forward pass) and safely (no pickle code).

The reference numbers come from `efml_reference.py`, an independent NumPy (float64)
re-implementation of their inference written from the `elmoformanylangs` 0.0.4.post2 source
(`read_list`, `create_one_batch`, `ConvTokenEmbedder`, AllenNLP's `Highway` and
`LstmCellWithProjection`, `ElmobiLm`, `Model.forward`), sharing no code with spacy_elmo.
The models are tiny random-weight directories in their layout (state dict keys as their modules
name them, saved with torch.save).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy
import pytest
import torch

from spacy_elmo import BiLM
from spacy_elmo.weights.elmoformanylangs import is_elmoformanylangs_dir, read_architecture
from spacy_elmo.weights.layouts import read_saved_options

from .efml_reference import (
    architecture,
    dictionaries,
    read_dic,
    reference_layers,
    their_ids,
    write_model,
)

TRAINING_TEXT = [
    ["Мама", "мыла", "раму", "."],
    ["我", "喜欢", "自然", "语言", "处理", "。"],
    ["Der", "Hund", "läuft", "schnell", "."],
    ["the", "river", "bank"],
]
SENTENCES = [
    ["Мама", "мыла", "раму", "."],
    ["我", "喜欢", "处理", "。"],
    ["Der", "Hund", "läuft", "schnell", "Ω", "unbekannt", "."],  # Ω: unknown char
    ["<bos>", "x", ""],  # a literal boundary token, an empty token
    ["ж" * 60, "the"],  # cut to 48 code points (not bytes)
    ["a b", "\u3000"],  # a space inside a token; U+3000 (a dic line that strip() emptied)
    [],
]


def make_model(tmp_path: Path, word_dim: int, seed: int = 0, **changes):
    arch = architecture(word_dim, **changes)
    chars, words = dictionaries(TRAINING_TEXT)
    directory = tmp_path / f"efml_{word_dim}_{seed}"
    # " \t<id>" is read back as U+3000 by their code (strip, then one field).
    weights = write_model(
        directory, arch, chars, words, seed=seed, extra_char_lines=(f" \t{len(chars)}",)
    )
    return directory, arch, weights


@pytest.mark.parametrize(
    "word_dim,changes",
    [
        (5, {}),  # with the word embedding (the published cnn_50_100 shape)
        (0, {"token_embedder": {"activation": "tanh", "n_highway": 1}, "encoder": {"n_layers": 3}}),
    ],
    ids=["word-embedding", "chars-only-tanh-3-layers"],
)
def test_every_layer_matches_their_forward_pass(tmp_path, word_dim, changes):
    directory, arch, weights = make_model(tmp_path, word_dim, **changes)
    char2id, word2id = read_dic(directory / "char.dic"), read_dic(directory / "word.dic")
    assert "\u3000" in char2id
    bilm = BiLM.from_elmoformanylangs(directory)
    n_layers = arch["encoder"]["n_layers"]
    ours = bilm.embed(SENTENCES, batch_size=3)
    for sentence, layers in zip(SENTENCES, ours):
        expected = reference_layers(weights, arch, sentence, char2id, word2id)
        assert layers.shape == (n_layers + 1, len(sentence), 12)
        numpy.testing.assert_allclose(layers, expected, atol=1e-5, rtol=0)
    # The layers differ from each other (the test would notice a swapped or missing layer).
    assert numpy.abs(ours[0][1] - ours[0][2]).max() > 1e-2
    # A padded batch through forward() gives the same numbers.
    output = bilm(bilm.batch_to_ids(SENTENCES[:3])).layers.detach().numpy()
    for row, sentence in enumerate(SENTENCES[:3]):
        expected = reference_layers(weights, arch, sentence, char2id, word2id)
        numpy.testing.assert_allclose(output[:, row, : len(sentence)], expected, atol=1e-5, rtol=0)


def test_ids_are_their_ids_plus_one(tmp_path):
    directory, arch, _ = make_model(tmp_path, 5)
    char2id, word2id = read_dic(directory / "char.dic"), read_dic(directory / "word.dic")
    bilm = BiLM.from_elmoformanylangs(directory)
    ids = bilm.batch_to_ids(SENTENCES).numpy()
    assert ids.shape == (len(SENTENCES), 7, 51)
    for row, sentence in enumerate(SENTENCES):
        chars, words = their_ids(sentence, char2id, word2id, 50)
        n = len(sentence)
        numpy.testing.assert_array_equal(ids[row, :n, :50], chars[1:-1] + 1)
        numpy.testing.assert_array_equal(ids[row, :n, 50], words[1:-1] + 1)
        assert (ids[row, n:] == 0).all()
    # The begin-of-word slot holds the id of '<eow>' (their create_one_batch), and <bos> is
    # a boundary row.
    assert ids[0, 0, 0] == char2id["<eow>"] + 1
    assert bilm.lexicon.bos_ids == tuple(ids[3, 0])
    assert ids[2, 4, 1] == char2id["<oov>"] + 1  # Ω
    assert ids[5, 1, 1] == char2id["\u3000"] + 1
    assert ids[5, 0, 2] == char2id["<oov>"] + 1  # the space of "a b"


def test_save_and_load_round_trip_without_pickle(tmp_path):
    directory, _, _ = make_model(tmp_path, 5)
    bilm = BiLM.from_elmoformanylangs(directory)
    saved = tmp_path / "saved"
    bilm.save(saved)
    assert sorted(p.name for p in saved.iterdir()) == [
        "config.json",
        "lexicon.json",
        "model.safetensors",
    ]
    lexicon = json.loads((saved / "lexicon.json").read_text(encoding="utf-8"))
    assert lexicon["chars"]["\u3000"] == bilm.lexicon.chars["\u3000"]
    loaded = BiLM.load(saved)
    for a, b in zip(bilm.embed(SENTENCES), loaded.embed(SENTENCES)):
        numpy.testing.assert_array_equal(a, b)
    assert loaded.options == bilm.options
    # Without the lexicon the model cannot read tokens: a clear error, not byte ids.
    (saved / "lexicon.json").unlink()
    with pytest.raises(FileNotFoundError, match="lexicon.json"):
        BiLM.load(saved)


@pytest.mark.parametrize("kind", ["chars", "words"])
@pytest.mark.parametrize("where", ["negative", "past the table"])
def test_a_saved_lexicon_with_ids_off_the_tables_is_refused(tmp_path, kind, where):
    """`lexicon.json` is read without the dictionaries' line checks: its ids are held against
    the embedding tables, whose rows are those of their state dict."""
    directory, _, _ = make_model(tmp_path, 5)
    key = {"chars": "char_emb_layer", "words": "word_emb_layer"}[kind]
    rows = torch.load(directory / "token_embedder.pkl")[f"{key}.embedding.weight"].shape[0]
    BiLM.from_elmoformanylangs(directory).save(tmp_path / "saved")
    path = tmp_path / "saved" / "lexicon.json"
    lexicon = json.loads(path.read_text(encoding="utf-8"))
    index = -1 if where == "negative" else rows
    lexicon[kind]["<oov>"] = index
    path.write_text(json.dumps(lexicon), encoding="utf-8")
    what = {"chars": "character", "words": "word"}[kind]
    with pytest.raises(ValueError) as error:
        BiLM.load(tmp_path / "saved")
    assert (
        f"the {what} dictionary gives '<oov>' the id {index} but the {what} embedding has "
        f"{rows} rows (ids 0 to {rows - 1})"
    ) in str(error.value)


def model_naming_its_architecture(tmp_path: Path, config_path: str) -> Path:
    """A model whose config.json names its architecture file by `config_path`: their released
    config.json files name a path on the machine they were trained on."""
    chars, words = dictionaries(TRAINING_TEXT)
    directory = tmp_path / "model"
    write_model(directory, architecture(0), chars, words, config_path=config_path)
    return directory


def test_architecture_found_by_file_name_next_to_config(tmp_path):
    directory = model_naming_its_architecture(tmp_path, "/data/train/configs/cnn_tiny.json")
    bilm = BiLM.from_elmoformanylangs(directory)
    assert bilm.options.projection_dim == 6 and bilm.options.word_embedding_dim == 0
    (directory / "cnn_tiny.json").unlink()
    with pytest.raises(FileNotFoundError, match="cnn_tiny.json"):
        BiLM.from_elmoformanylangs(directory)


def test_published_architecture_name_falls_back_with_a_warning(tmp_path):
    directory = model_naming_its_architecture(tmp_path, "/x/cnn_50_100_512_4096_sample.json")
    (directory / "cnn_50_100_512_4096_sample.json").unlink()
    # The published 512/4096 architecture (with a word embedding) does not fit the tiny weights.
    with pytest.warns(UserWarning, match="using the published"):
        with pytest.raises(ValueError, match=r"token_embedder\.pkl"):
            BiLM.from_elmoformanylangs(directory)


def test_is_elmoformanylangs_dir(tmp_path):
    directory, _, _ = make_model(tmp_path, 0)
    assert is_elmoformanylangs_dir(directory)
    assert not is_elmoformanylangs_dir(tmp_path)


def test_saved_options_name_an_elmoformanylangs_directory(tmp_path):
    directory, _, _ = make_model(tmp_path, 0)
    with pytest.raises(ValueError, match="is an ELMoForManyLangs model directory, not a saved"):
        read_saved_options(directory)
    (directory / "encoder.pkl").unlink()
    with pytest.raises(FileNotFoundError, match=r"model directory .* lacks encoder\.pkl \(a model"):
        BiLM.load(directory)


class Exploit:
    """Unpickling this creates a file: what a malicious .pkl could do with any code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("name", ["token_embedder.pkl", "encoder.pkl"])
@pytest.mark.parametrize("how", ["torch.save", "pickle"])
def test_a_pickle_that_runs_code_is_refused(tmp_path, name, how):
    directory, _, _ = make_model(tmp_path, 5)
    marker = tmp_path / "pwned"
    state = torch.load(directory / name, weights_only=True)
    state["exploit"] = Exploit(marker)
    if how == "torch.save":
        torch.save(state, directory / name)
    else:
        import pickle

        with open(directory / name, "wb") as file:
            pickle.dump(state, file)
    with pytest.raises(ValueError, match=f"refusing to load .* {directory / name}|cannot read"):
        BiLM.from_elmoformanylangs(directory)
    assert not marker.exists()
    # The guard is what protects: plain torch.load would have run it.
    if how == "torch.save":
        torch.load(directory / name, weights_only=False)
        assert marker.exists()


def test_crafted_pickle_error_names_the_file(tmp_path):
    directory, _, _ = make_model(tmp_path, 0)
    marker = tmp_path / "pwned"
    torch.save({"exploit": Exploit(marker)}, directory / "encoder.pkl")
    with pytest.raises(ValueError) as error:
        BiLM.from_elmoformanylangs(directory)
    message = str(error.value)
    assert str(directory / "encoder.pkl") in message and "refusing to load" in message
    assert not marker.exists()


def test_weights_that_do_not_match_the_config(tmp_path):
    directory, _, _ = make_model(tmp_path, 5)
    state = torch.load(directory / "encoder.pkl", weights_only=True)
    del state["backward_layer_1.state_projection.weight"]
    torch.save(state, directory / "encoder.pkl")
    with pytest.raises(ValueError, match="backward_layer_1.state_projection.weight"):
        BiLM.from_elmoformanylangs(directory)
    directory, _, _ = make_model(tmp_path, 5, seed=1)
    (directory / "char.dic").write_text("a\t0\n", encoding="utf-8")
    with pytest.raises(ValueError, match="<bos>"):
        BiLM.from_elmoformanylangs(directory)


def test_unsupported_architectures_are_named(tmp_path):
    directory, _, _ = make_model(tmp_path, 0, token_embedder={"name": "lstm"})
    with pytest.raises(ValueError, match="token_embedder 'lstm' is not supported"):
        BiLM.from_elmoformanylangs(directory)


def test_cli_load_bilm_recognises_the_directory(tmp_path):

    directory, _, _ = make_model(tmp_path, 5)
    bilm = BiLM.load(directory)
    assert bilm.lexicon is not None
    assert os.path.exists(directory / "encoder.pkl")


# ------------------------------------------------------------------ paths outside the folder
@pytest.mark.parametrize(
    "config_path",
    [
        "{outside}/cnn_tiny.json",  # an absolute path (theirs: the machine it was trained on)
        "../outside/cnn_tiny.json",  # a relative path that climbs out
        "sub/../../outside/cnn_tiny.json",
        "C:\\train\\configs\\cnn_tiny.json",  # a Windows path
        "{outside}/not_in_the_folder.json",  # no copy in the folder: an error, never read
    ],
)
def test_a_model_folder_is_read_only_from_inside_itself(tmp_path, caplog, config_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    for name in ("cnn_tiny.json", "not_in_the_folder.json"):
        (outside / name).write_text("not JSON: opened, it would be an error", encoding="utf-8")
    config_path = config_path.format(outside=outside)
    directory = model_naming_its_architecture(tmp_path, config_path)
    (directory / "cnn_tiny.json").write_text(json.dumps(architecture(0)), encoding="utf-8")
    assert (directory / "../outside/cnn_tiny.json").resolve() == outside / "cnn_tiny.json"
    if "not_in_the_folder" in config_path:
        (directory / "not_in_the_folder.json").unlink()
        with pytest.raises(FileNotFoundError, match="read only from inside itself"):
            BiLM.from_elmoformanylangs(directory)
        return
    with caplog.at_level(logging.INFO, logger="spacy_elmo.weights.elmoformanylangs"):
        bilm = BiLM.from_elmoformanylangs(directory)
    assert bilm.options.projection_dim == architecture(0)["encoder"]["projection_dim"]
    # Which file was used: in the log and in the description of the source.
    own = str(directory / "cnn_tiny.json")
    assert f"reading {own}" in caplog.text
    _, source = read_architecture(directory)
    assert source.startswith(f"{own} (config.json names")


# ------------------------------------------------------------------ the dictionaries
@pytest.mark.parametrize(
    "fault, message",
    [
        ("char.dic -1", "{path}, line 3: the id of {token!r} is -1; ids are 0 to {last}, the rows"),
        ("char.dic past", "{path}, line 3: the id of {token!r} is {rows}; ids are 0 to {last}, "),
        ("word.dic -1", "{path}, line 2: the id of {token!r} is -1; ids are 0 to {last}, the rows"),
        ("no char.dic", "model directory {directory} lacks char.dic (a model holds config.json"),
        ("only config.json", "{directory} lacks char.dic, token_embedder.pkl, encoder.pkl"),
    ],
)
def test_dictionary_faults_name_the_file_line_and_value(tmp_path, fault, message):
    directory, _, _ = make_model(tmp_path, 5)
    path = directory / fault.split()[0]
    token, rows = "", 0
    if fault.endswith(("-1", "past")):
        lines = path.read_text(encoding="utf-8").splitlines()
        number = 3 if path.name == "char.dic" else 2
        token, rows = lines[number - 1].split("\t")[0], len(read_dic(path))
        lines[number - 1] = f"{token}\t{-1 if fault.endswith('-1') else rows}"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    else:
        for unwanted in ["char.dic"] + ["token_embedder.pkl", "encoder.pkl", "word.dic"] * (
            fault == "only config.json"
        ):
            (directory / unwanted).unlink()
    assert is_elmoformanylangs_dir(directory)
    expected = message.format(path=path, directory=directory, token=token, rows=rows, last=rows - 1)
    for load in (BiLM.from_elmoformanylangs, BiLM.load):  # by name, and as the resolver finds it
        with pytest.raises(ValueError) as error:
            load(directory)
        assert expected in str(error.value)
        assert "model.safetensors" not in str(error.value)


@pytest.mark.parametrize("word_dim", [5, 0])
def test_the_reference_biLM_matches_their_forward_pass_and_ours(tmp_path, word_dim):
    """The one-file reference (`bilm/reference.py`) with the model's dictionaries: their numbers,
    and the default route's to 1e-6."""
    from spacy_elmo.bilm.reference import ReferenceBiLM

    directory, arch, weights = make_model(tmp_path, word_dim)
    char2id, word2id = read_dic(directory / "char.dic"), read_dic(directory / "word.dic")
    bilm = BiLM.from_elmoformanylangs(directory)
    reference = ReferenceBiLM.of(bilm)
    ids = bilm.batch_to_ids(SENTENCES)
    boundaries = (bilm.lexicon.bos_ids, bilm.lexicon.eos_ids)
    with torch.no_grad():
        layers, _ = reference(ids, boundaries=boundaries)
        torch.testing.assert_close(bilm(ids).layers, layers, atol=1e-6, rtol=0)
    for row, sentence in enumerate(SENTENCES):
        expected = reference_layers(weights, arch, sentence, char2id, word2id)
        got = layers[:, row, : len(sentence)].numpy()
        numpy.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
