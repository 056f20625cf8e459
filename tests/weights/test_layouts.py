"""Round trips of both weight formats, no-skip models, and clear errors for bad files."""

from __future__ import annotations

import json
import shutil

import h5py
import numpy as np
import pytest
import torch

from spacy_elmo import BiLM, BiLMOptions
from spacy_elmo.pretrain.presets import PUBLISHED_PARAMETERS, preset

from ..bilm.util import tiny_options, write_random_model

SENTENCES = [["Hello", "world", "!"], ["ELMo", "in", "spaCy"], []]


@pytest.fixture
def model_files(tmp_path):
    return write_random_model(tmp_path / "model", tiny_options(), seed=3)


def outputs(bilm):
    return bilm.embed(SENTENCES)


def test_save_load_round_trip_is_exact(tmp_path, model_files):
    bilm = BiLM.from_allennlp(*model_files)
    bilm.save(tmp_path / "saved")
    assert sorted(p.name for p in (tmp_path / "saved").iterdir()) == [
        "config.json",
        "model.safetensors",
    ]
    loaded = BiLM.load(tmp_path / "saved")
    assert loaded.options == bilm.options
    for a, b in zip(outputs(bilm), outputs(loaded)):
        np.testing.assert_array_equal(a, b)
    for key, value in bilm.state_dict().items():
        assert torch.equal(value, loaded.state_dict()[key]), key


def test_export_import_round_trip_is_bit_identical(tmp_path, model_files):
    bilm = BiLM.from_allennlp(*model_files)
    bilm.to_allennlp(tmp_path / "out" / "options.json", tmp_path / "out" / "weights.hdf5")
    again = BiLM.from_allennlp(tmp_path / "out" / "options.json", tmp_path / "out" / "weights.hdf5")
    for a, b in zip(outputs(bilm), outputs(again)):
        np.testing.assert_array_equal(a, b)
    # The export holds exactly the datasets of the original file, with identical values.
    with (
        h5py.File(model_files[1]) as original,
        h5py.File(tmp_path / "out" / "weights.hdf5") as ours,
    ):
        names = set()
        original.visititems(lambda n, o: names.add(n) if isinstance(o, h5py.Dataset) else None)
        for name in names:
            np.testing.assert_array_equal(original[name][...], ours[name][...])
            assert ours[name].dtype == np.float32
        ours.visititems(lambda n, o: names.discard(n) if isinstance(o, h5py.Dataset) else None)
        assert not names


def test_fixture_export_reproduces_the_same_outputs(tmp_path, allennlp_fixture):
    bilm = BiLM.from_allennlp(
        allennlp_fixture / "options.json", allennlp_fixture / "lm_weights.hdf5"
    )
    bilm.to_allennlp(tmp_path / "o.json", tmp_path / "w.hdf5")
    again = BiLM.from_allennlp(tmp_path / "o.json", tmp_path / "w.hdf5")
    for a, b in zip(outputs(bilm), outputs(again)):
        np.testing.assert_array_equal(a, b)


def test_model_without_skip_connections_runs_and_differs(tmp_path):
    skip_files = write_random_model(tmp_path / "skip", tiny_options(), seed=4)
    no_skip_files = write_random_model(
        tmp_path / "noskip", tiny_options(lstm__use_skip_connections=False), seed=4
    )
    with h5py.File(skip_files[1]) as a, h5py.File(no_skip_files[1]) as b:  # same weights
        np.testing.assert_array_equal(a["char_embed"][...], b["char_embed"][...])
    with_skip = BiLM.from_allennlp(*skip_files).embed(SENTENCES)
    without = BiLM.from_allennlp(*no_skip_files).embed(SENTENCES)
    for a, b in zip(with_skip[:2], without[:2]):
        np.testing.assert_array_equal(a[:2], b[:2])  # layers 0 and 1 have no residual
        assert np.abs(a[2] - b[2]).max() > 1e-3


def test_options_round_trip_keeps_unknown_keys():
    raw = tiny_options()
    raw["lstm"]["custom"] = 1
    raw["n_tokens_vocab"] = 100
    options = BiLMOptions.from_dict(raw)
    assert BiLMOptions.from_dict(options.to_dict()) == options
    assert options.to_dict()["n_tokens_vocab"] == 100
    assert options.to_dict()["lstm"]["custom"] == 1


# The published shapes: LSTM dim, projection dim, highway layers.
PUBLISHED = {"small": (1024, 128, 1), "medium": (2048, 256, 1), "original": (4096, 512, 2)}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_of_the_published_shapes(name):
    dim, projection, highway = PUBLISHED[name]
    count = PUBLISHED_PARAMETERS[name]
    raw = tiny_options(
        lstm__dim=dim,
        lstm__projection_dim=projection,
        char_cnn__n_highway=highway,
        char_cnn__embedding={"dim": 16},
        char_cnn__filters=[[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]],
    )
    options = BiLMOptions.from_dict(raw)
    assert options.n_parameters() == count
    assert BiLMOptions.from_dict(preset(name)) == options  # the preset of that name
    if name == "small":  # the module holds the same, plus the zero "no token" embedding row
        module_count = sum(p.numel() for p in BiLM(options).parameters())
        assert module_count == count + 16


# ------------------------------------------------------------------ bad files
def test_missing_weights_file_is_a_clear_error(tmp_path, model_files):
    with pytest.raises(ValueError, match="does not exist") as info:
        BiLM.from_allennlp(model_files[0], tmp_path / "nope.hdf5")
    assert isinstance(info.value, FileNotFoundError)
    assert "nope.hdf5" in str(info.value)


def test_truncated_weights_file(tmp_path, model_files):
    truncated = tmp_path / "truncated.hdf5"
    truncated.write_bytes(model_files[1].read_bytes()[:5000])
    with pytest.raises(ValueError, match="truncated.hdf5"):
        BiLM.from_allennlp(model_files[0], truncated)


def test_not_an_hdf5_file(tmp_path, model_files):
    with pytest.raises(ValueError, match="HDF5"):
        BiLM.from_allennlp(model_files[0], model_files[0])


def test_foreign_hdf5_names_the_missing_dataset(tmp_path, model_files):
    foreign = tmp_path / "foreign.hdf5"
    with h5py.File(foreign, "w") as f:
        f.create_dataset("embeddings", data=np.zeros((3, 4)))
    with pytest.raises(ValueError, match="no dataset 'char_embed'.*is this an ELMo weights file"):
        BiLM.from_allennlp(model_files[0], foreign)


def test_missing_dataset_is_named(tmp_path, model_files):
    broken = tmp_path / "broken.hdf5"
    shutil.copy(model_files[1], broken)
    with h5py.File(broken, "a") as f:
        del f["RNN_1/RNN/MultiRNNCell/Cell1/LSTMCell/B"]
    with pytest.raises(ValueError, match="broken.hdf5 has no dataset 'RNN_1/.*Cell1/LSTMCell/B'"):
        BiLM.from_allennlp(model_files[0], broken)


def test_options_that_do_not_match_the_weights(tmp_path, model_files):
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps(tiny_options(lstm__dim=32)))
    with pytest.raises(ValueError, match="W_0' has shape .* but options file .*wrong.json"):
        BiLM.from_allennlp(wrong, model_files[1])
    fewer = tmp_path / "fewer.json"
    fewer.write_text(json.dumps(tiny_options(char_cnn__n_highway=0)))
    with pytest.raises(ValueError, match="does not describe: CNN_high_0"):
        BiLM.from_allennlp(fewer, model_files[1])


def test_non_finite_weights(tmp_path, model_files):
    nan = tmp_path / "nan.hdf5"
    shutil.copy(model_files[1], nan)
    with h5py.File(nan, "a") as f:
        f["CNN/b_cnn_0"][0] = np.nan
    with pytest.raises(ValueError, match="'CNN/b_cnn_0' contains NaN"):
        BiLM.from_allennlp(model_files[0], nan)


def test_big_endian_weights_are_read_as_their_values(tmp_path, model_files):
    big = tmp_path / "big.hdf5"
    with h5py.File(model_files[1]) as little, h5py.File(big, "w") as swapped:
        names = []
        little.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        for name in names:
            swapped.create_dataset(name, data=little[name][...].astype(">f4"))
        assert swapped["CNN/b_cnn_0"].dtype.byteorder == ">"
    expected = BiLM.from_allennlp(*model_files).state_dict()
    for key, value in BiLM.from_allennlp(model_files[0], big).state_dict().items():
        assert torch.equal(value, expected[key]), key
    with h5py.File(big, "a") as f:
        f["CNN/b_cnn_0"][0] = np.nan
    with pytest.raises(ValueError, match="'CNN/b_cnn_0' contains NaN"):
        BiLM.from_allennlp(model_files[0], big)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"lstm__dim": None}, "lstm.dim"),
        ({"char_cnn__activation": "gelu"}, "activation"),
        ({"char_cnn__max_characters_per_token": 40}, "max_characters_per_token"),
        ({"char_cnn__filters": "wide"}, "filters"),
        ({"lstm__projection_dim": 48}, "larger than"),
        ({"lstm__n_layers": 0}, r"'lstm\.n_layers' must be at least 1, got 0"),
        ({"char_cnn__n_highway": -1}, r"'char_cnn\.n_highway' must be at least 0, got -1"),
        ({"char_cnn__filters": [[0, 4]]}, r"bad filter \[0, 4\]"),
        ({"char_cnn__embedding": 4}, r"'char_cnn\.embedding' must be an object, got 4"),
        ({"lstm__cell_clip": [3]}, r"'lstm\.cell_clip' must be a number or null, got \[3\]"),
        ({"char_cnn__n_characters": 300}, r"'char_cnn\.n_characters' is 300; expected 262"),
        ({"char_cnn__word_embedding": {"dim": 4, "n_words": 9}}, "needs 'char_cnn.char_vocab"),
    ],
)
def test_bad_options(tmp_path, model_files, change, message):
    raw = tiny_options(**{k: v for k, v in change.items() if v is not None})
    for key, value in change.items():
        if value is None:
            section, name = key.split("__")
            del raw[section][name]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=message):
        BiLM.from_allennlp(path, model_files[1])


def test_options_file_not_json(tmp_path, model_files):
    with pytest.raises(ValueError, match="not valid JSON"):
        BiLM.from_allennlp(model_files[1], model_files[1])


def test_saved_directory_errors(tmp_path, model_files):
    bilm = BiLM.from_allennlp(*model_files)
    bilm.save(tmp_path / "saved")
    with pytest.raises(ValueError, match="empty does not exist"):
        BiLM.load(tmp_path / "empty")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="empty holds no biLM"):
        BiLM.load(tmp_path / "empty")
    (tmp_path / "saved" / "config.json").rename(tmp_path / "config.json")
    with pytest.raises(ValueError, match="saved biLM config does not exist: .*config.json"):
        BiLM.load(tmp_path / "saved")
    (tmp_path / "config.json").rename(tmp_path / "saved" / "config.json")
    weights = tmp_path / "saved" / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="model.safetensors"):
        BiLM.load(tmp_path / "saved")
    bilm.save(tmp_path / "saved")
    config = json.loads((tmp_path / "saved" / "config.json").read_text())
    config["options"]["lstm"]["dim"] = 32
    (tmp_path / "saved" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="has shape .* but .*config.json implies"):
        BiLM.load(tmp_path / "saved")


# ------------------------------------------------------------------ torch.save files
class _RunsCode:
    """Unpickling it would create a file: what a crafted checkpoint or state dict could do."""

    def __init__(self, marker) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_read_torch_file_reads_plain_values_and_refuses_other_objects(tmp_path):
    from spacy_elmo.weights.tensors import read_torch_file

    plain = {"step": 3, "weights": torch.arange(4.0), "nested": [{"lr": 0.5}]}
    torch.save(plain, tmp_path / "plain.pt")
    state = read_torch_file(tmp_path / "plain.pt", "checkpoint")
    assert state["step"] == 3 and state["nested"] == [{"lr": 0.5}]
    assert torch.equal(state["weights"], plain["weights"])

    marker = tmp_path / "marker"
    torch.save({"step": _RunsCode(marker)}, tmp_path / "crafted.pt")
    with pytest.raises(ValueError, match=r"refusing to load a thing .*crafted\.pt: it holds"):
        read_torch_file(tmp_path / "crafted.pt", "a thing")
    assert not marker.exists()
    data = (tmp_path / "plain.pt").read_bytes()
    (tmp_path / "half.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"cannot read a thing .*half\.pt .*truncated or corr"):
        read_torch_file(tmp_path / "half.pt", "a thing")
