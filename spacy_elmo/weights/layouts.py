"""Weights on disk: the bilm-tf/AllenNLP hdf5 layout (docs/MODEL.md §3) and our own format.

Our format is a directory with `config.json` (the options) and `model.safetensors`. Every
function maps (options, state dict) to files or back; `BiLM` builds itself from them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterator

import numpy
import torch

from ..description.options import BiLMOptions
from ..util.files import atomic_path, write_text
from ..util.json_files import MissingFileError, read_json
from ..util.signals import deferred
from .elmoformanylangs import check_model_files
from .tensors import check_shapes, check_weights, read_safetensors, write_safetensors

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
FORMAT_NAME = "spacy-elmo-bilm"
FORMAT_VERSION = 1


# ---------------------------------------------------------------------- hdf5 <-> state dict
Convert = Callable[[list[numpy.ndarray]], list[numpy.ndarray]]


def _each(convert: Callable[[numpy.ndarray], numpy.ndarray]) -> Convert:
    return lambda arrays: [convert(array) for array in arrays]


def _stacked(arrays: list[numpy.ndarray]) -> list[numpy.ndarray]:
    """The arrays transposed and stacked by rows."""
    return [numpy.concatenate([array.T for array in arrays])]


def _split(rows: int) -> Convert:
    """The one array's first `rows` rows and the rest, each transposed (`_stacked` undone)."""
    return lambda arrays: [arrays[0][:rows].T, arrays[0][rows:].T]


def _conversions(
    options: BiLMOptions,
) -> Iterator[tuple[dict[str, tuple[int, ...]], list[str], Convert, Convert]]:
    """({hdf5 dataset: its shape}, state-dict keys, hdf5 -> torch, torch -> hdf5) for every
    tensor. An LSTM cell's W_0 stacks our input weight over the recurrent one; a highway
    layer's weight and bias are two datasets each (the transform's, the carry's)."""
    e, f = options.char_embedding_dim, options.n_filters
    p, d = options.projection_dim, options.lstm_dim
    same = _each(lambda a: a)
    transpose = _each(lambda a: a.T)
    # Row 0 of our table is the "no token" row; the file holds raw ids 0..260.
    yield (
        {"char_embed": (261, e)},
        ["char_cnn.char_embedding.weight"],
        _each(lambda a: numpy.concatenate([numpy.zeros((1, e), numpy.float32), a])),
        _each(lambda a: a[1:]),
    )
    for k, (width, n) in enumerate(options.filters):
        # TF conv2d kernel (1, w, e, n) <-> Conv1d weight (n, e, w); no flip.
        yield (
            {f"CNN/W_cnn_{k}": (1, width, e, n)},
            [f"char_cnn.convolutions.{k}.weight"],
            _each(lambda a: a[0].transpose(2, 1, 0)),
            _each(lambda a: a.transpose(2, 1, 0)[None]),
        )
        yield {f"CNN/b_cnn_{k}": (n,)}, [f"char_cnn.convolutions.{k}.bias"], same, same
    for h in range(options.n_highway):
        for ours, theirs, shape in (("weight", "W", (f, f)), ("bias", "b", (f,))):
            parts = {f"CNN_high_{h}/{theirs}_{part}": shape for part in ("transform", "carry")}
            yield parts, [f"char_cnn.highways.{h}.{ours}"], _stacked, _split(f)
    if options.has_char_projection:
        yield {"CNN_proj/W_proj": (f, p)}, ["char_cnn.projection.weight"], transpose, transpose
        yield {"CNN_proj/b_proj": (p,)}, ["char_cnn.projection.bias"], same, same
    hidden = p if options.has_lstm_projection else d
    for direction, stack in enumerate(("forward_lstm", "backward_lstm")):
        for layer in range(options.n_layers):
            prefix = f"RNN_{direction}/RNN/MultiRNNCell/Cell{layer}/LSTMCell"
            key = f"{stack}.layers.{layer}"
            # W_0 stacks the input rows (P of them) over the recurrent rows.
            cell = [f"{key}.input_weight", f"{key}.recurrent_weight"]
            yield {f"{prefix}/W_0": (p + hidden, 4 * d)}, cell, _split(p), _stacked
            yield {f"{prefix}/B": (4 * d,)}, [f"{key}.bias"], same, same
            if options.has_lstm_projection:
                projection = [f"{key}.projection_weight"]
                yield {f"{prefix}/W_P_0": (d, p)}, projection, transpose, transpose


def read_datasets(
    weight_file: Path, options: BiLMOptions, described_by: str
) -> Iterator[tuple[str, numpy.ndarray]]:
    """Each dataset of a bilm-tf weights file for `options` (`described_by` names them), read,
    checked and yielded in turn (a caller keeps what it needs); ValueError naming the file and
    dataset on any problem."""
    import h5py

    if not weight_file.exists():
        raise MissingFileError(2, "ELMo weights file does not exist", str(weight_file))
    expected = {name: shape for names, *_ in _conversions(options) for name, shape in names.items()}
    source = f"weights file {weight_file}"
    try:
        # h5py's finalizers would lose a stop raised inside them (util/signals.py)
        with deferred(), h5py.File(weight_file, "r") as hdf5:
            names: list[str] = []  # of every group and dataset in the file
            hdf5.visit(names.append)
            found = {name: hdf5[name] for name in names if isinstance(hdf5[name], h5py.Dataset)}
            if not set(found) & set(expected):
                raise ValueError(
                    f"{source} has no dataset 'char_embed' nor any other of bilm-tf's: is this "
                    f"an ELMo weights file?"
                )
            check_shapes(found, expected, source, described_by, "dataset")
            for name in expected:
                try:
                    array = found[name][...]  # as stored: checked before the cast to float32
                except (OSError, KeyError, RuntimeError) as err:
                    raise ValueError(
                        f"{source}: cannot read dataset '{name}' ({err}); the file may be "
                        f"truncated or corrupted"
                    ) from None
                check_weights({name: array}, source, "dataset")
                yield name, numpy.asarray(array, dtype=numpy.float32)
    except OSError as err:
        raise ValueError(
            f"cannot read weights file {weight_file} as HDF5 ({err}); it may be truncated, "
            f"corrupted or not an HDF5 file"
        ) from None


def read_allennlp(
    options_file: str | Path, weight_file: str | Path
) -> tuple[BiLMOptions, dict[str, torch.Tensor]]:
    """Options and a state dict for `BiLM` from bilm-tf/AllenNLP files."""
    options_file, weight_file = Path(options_file), Path(weight_file)
    options = BiLMOptions.from_file(options_file)
    arrays = dict(read_datasets(weight_file, options, f"options file {options_file}"))
    # Each dataset is converted and dropped in turn: loading holds the weights once, plus one
    # tensor being converted.
    state: dict[str, torch.Tensor] = {}
    for datasets, keys, to_torch, _ in _conversions(options):
        values = to_torch([arrays.pop(name) for name in datasets])
        for key, value in zip(keys, values):  # sharing its memory (copied if not contiguous)
            state[key] = torch.from_numpy(numpy.ascontiguousarray(value))
    return options, state


def write_allennlp(
    options: BiLMOptions,
    state_dict: dict[str, torch.Tensor],
    options_file: str | Path,
    weight_file: str | Path,
) -> None:
    """Write options.json and a float32 hdf5 with the dataset names of bilm-tf's dump_weights."""
    import h5py

    state = {k: v.detach().float().cpu().numpy() for k, v in state_dict.items()}
    datasets: dict[str, numpy.ndarray] = {}
    for names, keys, _, to_hdf5 in _conversions(options):
        datasets.update(zip(names, to_hdf5([state[key] for key in keys])))
    with atomic_path(weight_file) as tmp:
        with deferred(), h5py.File(tmp, "w") as hdf5:  # see `read_datasets`
            for name, array in datasets.items():
                hdf5.create_dataset(name, data=numpy.ascontiguousarray(array, dtype=numpy.float32))
    write_text(options_file, json.dumps(options.to_dict(), indent=2) + "\n")


# ---------------------------------------------------------------------- our own format
def write_saved(
    options: BiLMOptions, state_dict: dict[str, torch.Tensor], directory: str | Path
) -> None:
    """Write `config.json` and `model.safetensors` into `directory` (created if needed)."""
    directory = Path(directory)
    config = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "options": options.to_dict()}
    write_safetensors(state_dict, directory / WEIGHTS_NAME, metadata={"format": FORMAT_NAME})
    write_text(directory / CONFIG_NAME, json.dumps(config, indent=2) + "\n")


def read_saved_options(directory: str | Path) -> BiLMOptions:
    """The options in the `config.json` of a directory written by `write_saved`, with its format
    and version checked (the weights are not read)."""
    config_path = Path(directory) / CONFIG_NAME
    config = read_json(config_path, "saved biLM config")
    if isinstance(config, dict) and "config_path" in config and "format" not in config:
        # The config.json of an ELMoForManyLangs model, in a folder without its other files.
        check_model_files(Path(directory))
        raise ValueError(
            f"{directory} is an ELMoForManyLangs model directory, not a saved biLM: read it "
            f"with BiLM.from_elmoformanylangs (or BiLM.load)"
        )
    if not isinstance(config, dict) or config.get("format") != FORMAT_NAME:
        raise ValueError(
            f"{config_path} is not a spacy-elmo biLM config (no format '{FORMAT_NAME}')"
        )
    if config.get("version") != FORMAT_VERSION:
        raise ValueError(
            f"{config_path} has format version {config.get('version')!r}; this spacy-elmo "
            f"reads version {FORMAT_VERSION}"
        )
    return BiLMOptions.from_dict(config.get("options"), source=str(config_path))


def saved_weights(directory: str | Path, options: BiLMOptions) -> Path:
    """The weights file of a directory written by `write_saved` whose `read_saved_options` are
    `options`, checked to be large enough for them before a model of that size is built."""
    directory = Path(directory)
    config_path, weights_path = directory / CONFIG_NAME, directory / WEIGHTS_NAME
    if not weights_path.exists():
        raise MissingFileError(
            2, f"saved biLM directory {directory} has no {WEIGHTS_NAME}", str(weights_path)
        )
    size = weights_path.stat().st_size
    if 2 * options.n_parameters() > size:
        raise ValueError(
            f"{config_path} describes a biLM of {options.n_parameters():,} parameters, more than "
            f"{weights_path} ({size:,} bytes) holds; the config does not match the weights"
        )
    return weights_path


def read_saved(weights_path: Path, shapes: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """The state dict in the weights file that `saved_weights` checked, key by key against
    `shapes`, those of the model its config describes."""
    state = read_safetensors(weights_path)
    check_shapes(state, shapes, str(weights_path), str(weights_path.parent / CONFIG_NAME))
    check_weights(state, str(weights_path))
    return state
