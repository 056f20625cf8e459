"""Files a user receives run no code; outputs are never lost or half-written; bad values are
errors naming the file and value; the token cache is thread-safe and bounded."""

from __future__ import annotations

import copy
import json
import pickle
import re
import threading
import time
from pathlib import Path
from typing import Callable

import h5py
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from spacy_elmo import BiLM, BiLMOptions
from spacy_elmo.bilm import tokens as bilm_tokens
from spacy_elmo.cli import app
from spacy_elmo.corpus.embed_file import embed_file
from spacy_elmo.pretrain.corpus import iter_lines
from spacy_elmo.pretrain.vocab import Vocab

from .bilm.util import tiny_options, write_random_model


class Exploit:
    """Unpickling it creates `marker`: the proof that a loader ran code from a file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def malicious_pickle(marker: Path) -> bytes:
    data = pickle.dumps({"step": Exploit(marker)}, protocol=2)
    control = marker.with_name(marker.name + ".control")
    pickle.loads(pickle.dumps(Exploit(control)))  # the exploit works when unpickled
    assert control.exists()
    return data


@pytest.fixture
def model_files(tmp_path):
    return write_random_model(tmp_path / "model", tiny_options(), seed=4)


def run(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


# ---------------------------------------------------------------------- 1. no code execution
@pytest.mark.parametrize(
    "target", ["model.safetensors", "config.json", "weights.hdf5", "options.json", "vocab.txt"]
)
def test_a_malicious_pickle_is_refused_by_every_reader(tmp_path, model_files, target):
    marker = tmp_path / "marker"
    saved = tmp_path / "saved"
    BiLM.from_allennlp(*model_files).save(saved)
    paths = {
        "model.safetensors": saved / "model.safetensors",
        "config.json": saved / "config.json",
        "weights.hdf5": model_files[1],
        "options.json": model_files[0],
        "vocab.txt": tmp_path / "vocab.txt",
    }
    path = paths[target]
    path.write_bytes(malicious_pickle(marker))
    readers = {
        "model.safetensors": lambda: BiLM.load(saved),
        "config.json": lambda: BiLM.load(saved),
        "weights.hdf5": lambda: BiLM.from_allennlp(*model_files),
        "options.json": lambda: BiLM.from_allennlp(*model_files),
        "vocab.txt": lambda: Vocab.from_file(path),
    }
    with pytest.raises(ValueError) as error:
        readers[target]()
    assert str(path) in str(error.value)
    assert not marker.exists()


def test_the_spacy_deserialiser_does_not_unpickle(tmp_path):
    from spacy_elmo.layers.bilm_wrapper import deserialize_bilm

    marker = tmp_path / "marker"
    with pytest.raises(ValueError):
        deserialize_bilm(None, malicious_pickle(marker), "cpu")
    assert not marker.exists()


# ---------------------------------------------------------------------- 2. no data loss
@pytest.fixture
def embed_setup(tmp_path, model_files):
    text = tmp_path / "input.txt"
    text.write_text("the river bank\nflooded again .\n", encoding="utf-8")
    return tmp_path, BiLM.from_allennlp(*model_files), text


def test_embed_refuses_to_write_over_its_input(embed_setup, model_files):
    tmp_path, _, text = embed_setup
    before = text.read_bytes()
    result = run("embed", text, text, "--options", model_files[0], "--weights", model_files[1])
    assert result.exit_code == 1 and "is the input" in result.output
    result = run(
        "embed", text, model_files[1], "--options", model_files[0], "--weights", model_files[1]
    )
    assert result.exit_code == 1 and "is the input" in result.output
    assert text.read_bytes() == before
    assert BiLM.from_allennlp(*model_files) is not None  # the weights are intact


def test_an_interrupted_embed_keeps_the_earlier_output(embed_setup):
    tmp_path, bilm, text = embed_setup
    out = tmp_path / "out.hdf5"
    embed_file(bilm, text, out, progress=False)
    good = out.read_bytes()

    def interrupted(line: str) -> list[str]:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        embed_file(bilm, text, out, progress=False, tokenize=interrupted)
    assert out.read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_an_unwritable_output_fails_before_the_computation(embed_setup):
    tmp_path, bilm, text = embed_setup
    calls = []

    def tokenize(line: str) -> list[str]:
        calls.append(line)
        return line.split()

    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    for output, message in [(blocker / "out.hdf5", "cannot write output"), (tmp_path, "directory")]:
        with pytest.raises(ValueError, match=message):
            embed_file(bilm, text, output, progress=False, tokenize=tokenize)
    assert calls == []
    result = run("perplexity", text, "--output", blocker / "out.json")
    assert result.exit_code == 1 and "cannot write output" in result.output


def test_perplexity_output_is_not_an_input(embed_setup):
    tmp_path, _, text = embed_setup
    result = run("perplexity", text, "--output", text, "--force")
    assert result.exit_code == 1 and "is the input" in result.output
    assert text.read_text(encoding="utf-8").startswith("the river bank")


# ---------------------------------------------------------------------- 4. no silent wrong numbers
def test_nan_weights_in_a_saved_model_are_an_error(tmp_path, model_files):
    saved = tmp_path / "saved"
    BiLM.from_allennlp(*model_files).save(saved)
    tensors = load_file(str(saved / "model.safetensors"))
    tensors["char_cnn.highways.0.bias"][3] = float("nan")
    save_file(tensors, str(saved / "model.safetensors"))
    with pytest.raises(ValueError, match="model.safetensors: tensor 'char_cnn.highways.0.bias'"):
        BiLM.load(saved)


def test_a_config_larger_than_its_weights_is_refused_before_allocating(tmp_path, model_files):
    saved = tmp_path / "saved"
    BiLM.from_allennlp(*model_files).save(saved)
    config = json.loads((saved / "config.json").read_text())
    config["options"]["lstm"].update(dim=2**20, projection_dim=2**19)  # 2^42 parameters
    (saved / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="parameters, more than .*model.safetensors"):
        BiLM.load(saved)


@pytest.mark.parametrize(
    "section, key, value, message",
    [
        ("lstm", "dim", 24.7, "'lstm.dim' must be an integer, got 24.7"),
        ("lstm", "n_layers", "2", "'lstm.n_layers' must be an integer, got '2'"),
        ("char_cnn", "filters", [[1, 4.5]], "'char_cnn.filters' must be an integer, got 4.5"),
        ("char_cnn", "n_highway", True, "'char_cnn.n_highway' must be an integer, got True"),
        ("lstm", "use_skip_connections", "no", "must be true or false, got 'no'"),
        ("lstm", "cell_clip", "3", "'lstm.cell_clip' must be a number or null"),
    ],
)
def test_options_values_of_the_wrong_type_are_errors(section, key, value, message):
    options = tiny_options(**{f"{section}__{key}": value})
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace(".", r"\.")):
        BiLMOptions.from_dict(options, source="opts.json")


def test_whole_float_sizes_are_accepted():
    options = tiny_options(lstm__dim=24.0)
    assert BiLMOptions.from_dict(options).lstm_dim == 24


@pytest.mark.parametrize("section", ["lstm", "char_cnn"])
def test_missing_or_mistyped_option_sections_are_errors(section):
    options = tiny_options()
    del options[section]
    with pytest.raises(ValueError, match=f"missing the '{section}' object"):
        BiLMOptions.from_dict(options, source="opts.json")
    options[section] = [1, 2]
    with pytest.raises(ValueError, match=f"missing the '{section}' object, got \\[1, 2\\]"):
        BiLMOptions.from_dict(options, source="opts.json")


@pytest.mark.parametrize(
    "data, message",
    [
        (np.ones(4, np.complex64), "complex dtype"),
        (np.array([b"a", b"b", b"c", b"d"]), "non-numeric dtype"),
    ],
)
def test_hdf5_datasets_that_are_not_real_numbers_are_errors(model_files, data, message):
    options, weights = model_files
    with h5py.File(weights, "a") as f:
        del f["CNN/b_cnn_0"]
        f.create_dataset("CNN/b_cnn_0", data=data)
    with pytest.raises(ValueError, match=f"dataset 'CNN/b_cnn_0' has {message}"):
        BiLM.from_allennlp(options, weights)


def test_a_byte_order_mark_is_not_part_of_the_first_token(embed_setup):
    tmp_path, bilm, text = embed_setup
    with_bom = tmp_path / "bom.txt"
    with_bom.write_bytes(b"\xef\xbb\xbf" + text.read_bytes())
    plain, marked = tmp_path / "plain.hdf5", tmp_path / "marked.hdf5"
    embed_file(bilm, text, plain, progress=False)
    embed_file(bilm, with_bom, marked, progress=False)
    with h5py.File(plain) as a, h5py.File(marked) as b:
        np.testing.assert_array_equal(a["0"][...], b["0"][...])
        assert json.loads(b["sentence_to_index"][0]) == {
            "the river bank": "0",
            "flooded again .": "1",
        }
    assert list(iter_lines([with_bom])) == ["the river bank", "flooded again ."]
    options = tmp_path / "bom_options.json"
    options.write_bytes(b"\xef\xbb\xbf" + json.dumps(tiny_options()).encode())
    assert BiLMOptions.from_file(options).lstm_dim == 24


# ---------------------------------------------------------------------- 5. sizes
def test_embed_runs_long_lines_as_windows(embed_setup):
    tmp_path, bilm, _ = embed_setup
    tokens = "a b c d e f g".split()
    text = tmp_path / "long.txt"
    text.write_text(" ".join(tokens) + "\nshort line\n\n", encoding="utf-8")
    out = tmp_path / "long.hdf5"
    assert embed_file(bilm, text, out, progress=False, max_tokens=3) == 3
    windows = bilm.embed([tokens[0:3], tokens[3:6], tokens[6:7], ["short", "line"], []])
    with h5py.File(out) as f:
        np.testing.assert_array_equal(f["0"][...], np.concatenate(windows[:3], axis=1))
        np.testing.assert_array_equal(f["1"][...], windows[3])
        assert f["2"].shape == (3, 0, 16)
    with pytest.raises(ValueError, match="max_tokens must be a positive integer"):
        embed_file(bilm, text, out, progress=False, max_tokens=0)


def test_an_over_long_corpus_line_is_split_with_a_warning(tmp_path, caplog):
    corpus = tmp_path / "corpus.txt"
    long_line = " ".join(f"w{i}" for i in range(40))  # 149 characters
    corpus.write_text(f"first line\n{long_line}\nlast line", encoding="utf-8")
    with caplog.at_level("WARNING", logger="spacy_elmo.pretrain"):
        lines = list(iter_lines([corpus], max_chars=20))
    assert f"{corpus}, line 2: longer than 20 characters" in caplog.text
    assert lines[0] == "first line" and lines[-1] == "last line"
    assert all(len(line) <= 20 for line in lines)
    assert " ".join(lines[1:-1]).split() == long_line.split()


# ---------------------------------------------------------------------- 6. shared state
def test_embed_from_several_threads_on_one_model(model_files):
    bilm = BiLM.from_allennlp(*model_files)
    bilm.token_cache_size = 7  # constant eviction while other threads read
    reference = BiLM.from_allennlp(*model_files)
    reference.token_cache_size = 0
    rng = np.random.default_rng(0)
    work = [
        [[f"tok{rng.integers(60)}" for _ in range(rng.integers(1, 9))] for _ in range(6)]
        for _ in range(8)
    ]
    results: dict[int, list] = {}
    errors: list[BaseException] = []

    def embed(index: int) -> None:
        try:
            for _ in range(15):
                results[index] = bilm.embed(work[index], batch_size=2)
        except BaseException as err:  # noqa: BLE001 - reported by the main thread
            errors.append(err)

    threads = [threading.Thread(target=embed, args=(i,)) for i in range(len(work))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    for index, sentences in enumerate(work):
        for got, want in zip(results[index], reference.embed(sentences)):
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_the_token_cache_is_bounded_in_bytes(model_files, monkeypatch):
    monkeypatch.setattr(bilm_tokens, "TOKEN_CACHE_BYTES", 10 * (400 + 8 * 4))
    bilm = BiLM.from_allennlp(*model_files)
    bilm.embed([[f"word{i}" for i in range(50)]])
    cache = bilm.token_cache.rows
    assert len(cache) == cache.capacity == 10  # the rows' tensor and 10 keys fit, not 11
    rows = cache.rows.numel() * cache.rows.element_size()
    keys = sum(len(key) for key in cache.slots)
    assert cache.nbytes == rows + keys <= bilm_tokens.TOKEN_CACHE_BYTES
    # the rows are the cache's own tensor: a stored row does not keep its whole batch alive
    assert cache.rows.untyped_storage().nbytes() == rows == 10 * 8 * 4


def test_a_model_with_its_lock_can_be_copied_and_pickled(model_files):
    bilm = BiLM.from_allennlp(*model_files)
    sentences = [["the", "river"], ["bank"]]
    want = bilm.embed(sentences)
    for other in (copy.deepcopy(bilm), pickle.loads(pickle.dumps(bilm))):
        for a, b in zip(other.embed(sentences), want):
            np.testing.assert_array_equal(a, b)


def test_nan_weights_in_spacy_bytes_are_an_error():
    """The spaCy deserialiser checks the weights as the file loaders do."""
    import torch

    from spacy_elmo import BiLM, BiLMOptions
    from spacy_elmo.layers.bilm_wrapper import deserialize_bilm, serialize_bilm
    from spacy_elmo.pretrain.presets import preset

    bilm = BiLM(BiLMOptions.from_dict(preset("tiny")))
    restored = deserialize_bilm(bilm, serialize_bilm(bilm), torch.device("cpu"))
    assert torch.equal(restored.char_cnn.char_embedding.weight, bilm.char_cnn.char_embedding.weight)
    with torch.no_grad():
        bilm.char_cnn.char_embedding.weight[3, 0] = float("nan")
    with pytest.raises(ValueError, match="serialised elmo model.*NaN"):
        deserialize_bilm(bilm, serialize_bilm(bilm), torch.device("cpu"))


def test_a_truncated_component_file_names_the_component_and_file(tmp_path, bilm_dir):
    import spacy

    from .pipeline.pipeline_util import tiny_nlp

    tiny_nlp(bilm_dir).to_disk(tmp_path / "pipeline")
    model = tmp_path / "pipeline" / "elmo" / "model"
    model.write_bytes(model.read_bytes()[: model.stat().st_size // 2])
    with pytest.raises(ValueError, match=r"'elmo' component's files .*truncated") as info:
        spacy.load(tmp_path / "pipeline")
    assert str(model) in str(info.value)


# ---------------------------------------------------------------------- 5. foreign tensor types
# Every weight source is checked as stored, before its cast to float32, by one check:
# floating-point weights (float16, bfloat16, float32, float64 within float32's range) load as
# their float32 values; complex, boolean and integer tensors, NaN and inf are refused.
BIAS = {  # the same weights (the first convolution's 4 biases) under each source's key
    "hdf5": "CNN/b_cnn_0",
    "safetensors": "char_cnn.convolutions.0.bias",
    "pkl": "convolutions.0.bias",
    "checkpoint": "bilm.char_cnn.convolutions.0.bias",
}
VALUES = np.array([0.1, -2.5, 1e-3, 3.0])
REFUSED = {
    "complex64": (torch.complex64, "has complex dtype complex64"),
    "bool": (torch.bool, "has boolean dtype bool"),
    "int64": (torch.int64, "has integer dtype int64"),
    "nan": (torch.float32, r"contains NaN or inf \(1 of 4 values; nan at \[2\]\)"),
    "inf": (torch.float32, r"contains NaN or inf \(1 of 4 values; -inf at \[2\]\)"),
    "float64-overflow": (torch.float64, r"holds float64 values up to 1e\+39, past float32's"),
}
ACCEPTED = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}


def float32_of(tensor: torch.Tensor) -> np.ndarray:
    """The float32 value of each weight, worked out without torch's casts."""
    if tensor.dtype == torch.bfloat16:  # the upper 16 bits of a float32
        bits = tensor.view(torch.int16).numpy().astype(np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32)
    return tensor.numpy().astype(np.float32)


def weights_in(source: str, tensor: torch.Tensor, tmp_path: Path):
    """Write a model of `source` whose first convolution's biases are `tensor` (as stored);
    return a function that loads them, as the source's loader casts them (float32)."""
    from spacy_elmo.pretrain.checkpoint import load_checkpoint, save_checkpoint

    key = BIAS[source]
    if source == "hdf5":
        options, weights = write_random_model(tmp_path / "hdf5", tiny_options(), seed=1)
        with h5py.File(weights, "a") as f:
            del f[key]
            f.create_dataset(key, data=tensor.numpy())
        return lambda: BiLM.from_allennlp(options, weights).char_cnn.convolutions[0].bias
    if source == "safetensors":
        saved = tmp_path / "saved"
        BiLM.from_allennlp(*write_random_model(tmp_path / "m", tiny_options(), seed=1)).save(saved)
        tensors = load_file(str(saved / "model.safetensors"))
        tensors[key] = tensor
        save_file(tensors, str(saved / "model.safetensors"))
        return lambda: BiLM.load(saved).char_cnn.convolutions[0].bias
    if source == "pkl":
        from .weights.efml_reference import architecture, dictionaries, write_model

        directory = tmp_path / "efml"
        write_model(directory, architecture(0), *dictionaries([["a", "b"]]))
        state = torch.load(directory / "token_embedder.pkl", weights_only=True)
        state[key] = tensor
        torch.save(state, directory / "token_embedder.pkl")
        return lambda: BiLM.from_elmoformanylangs(directory).char_cnn.convolutions[0].bias
    path = tmp_path / "last.pt"
    state = {"config": {}, "optimizer": {}, "scheduler": {}, "torch_rng": torch.get_rng_state()}
    state.update(step=1, tokens_seen=10, train_seconds=1.0, model={key: tensor})
    save_checkpoint(state, path)
    return lambda: load_checkpoint(path)["model"][key].float()


@pytest.mark.parametrize("source", list(BIAS))
@pytest.mark.parametrize("case", [*REFUSED, *ACCEPTED])
def test_every_weight_source_checks_the_dtype_and_values_before_any_cast(tmp_path, source, case):
    if source == "hdf5" and case == "bfloat16":
        pytest.skip("HDF5 has no bfloat16")
    dtype, message = REFUSED.get(case, (ACCEPTED.get(case), None))
    tensor = torch.tensor(VALUES, dtype=torch.float64).to(dtype)
    if case == "complex64":
        tensor = tensor + 0.37j  # the imaginary part a cast to float32 would drop
    elif case in ("nan", "inf", "float64-overflow"):
        tensor[2] = {"nan": float("nan"), "inf": float("-inf"), "float64-overflow": 1e39}[case]
    load = weights_in(source, tensor, tmp_path)
    if message is not None:
        with pytest.raises(ValueError, match=f"'{BIAS[source]}' {message}"):
            load()
        return
    loaded = load()
    assert loaded.dtype == torch.float32
    np.testing.assert_array_equal(loaded.detach().numpy(), float32_of(tensor))


# ---------------------------------------------------------------------- 6. JSON of any size
def _efml_model(tmp_path: Path) -> Path:
    from .weights.efml_reference import architecture, dictionaries, write_model

    directory = tmp_path / "efml"
    write_model(directory, architecture(3), *dictionaries([["a", "b"]]))
    return directory


def _json_files(tmp_path: Path) -> dict[str, tuple[Path, Callable[[], object]]]:
    """For every JSON a loader reads: the file, and the call that reads it."""
    options, weights = write_random_model(tmp_path / "allennlp", tiny_options(), seed=1)
    saved = tmp_path / "saved"
    BiLM.from_allennlp(options, weights).save(saved)
    efml = _efml_model(tmp_path)
    efml_saved = tmp_path / "efml_saved"
    BiLM.from_elmoformanylangs(efml).save(efml_saved)
    return {
        "options.json": (options, lambda: BiLM.from_allennlp(options, weights)),
        "saved config.json": (saved / "config.json", lambda: BiLM.load(saved)),
        "ELMoForManyLangs config.json": (
            efml / "config.json",
            lambda: BiLM.from_elmoformanylangs(efml),
        ),
        "architecture JSON": (efml / "cnn_tiny.json", lambda: BiLM.from_elmoformanylangs(efml)),
        "lexicon.json": (efml_saved / "lexicon.json", lambda: BiLM.load(efml_saved)),
    }


@pytest.mark.parametrize(
    "which",
    [
        "options.json",
        "saved config.json",
        "ELMoForManyLangs config.json",
        "architecture JSON",
        "lexicon.json",
    ],
)
def test_every_json_a_loader_reads_is_bounded_in_size(tmp_path, which):
    path, load = _json_files(tmp_path)[which]
    load()  # as written, it loads
    with open(path, "r+b") as handle:  # 300 MB (sparse): the JSON, then zero bytes
        handle.seek((300 << 20) - 1)
        handle.write(b" ")
    started = time.perf_counter()
    with pytest.raises(ValueError, match=f"{re.escape(str(path))} is larger than the"):
        load()
    assert time.perf_counter() - started < 5  # refused by its size, not read
