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
def _conversions(
    options: BiLMOptions,
) -> Iterator[tuple[str, tuple[int, ...], str, Callable, Callable]]:
    """(hdf5 dataset, its shape, state-dict key, hdf5->torch, torch->hdf5) for every tensor.

    Highway weights are two datasets each (transform, carry) and are handled separately.
    """
    e, f = options.char_embedding_dim, options.n_filters
    p, d = options.projection_dim, options.lstm_dim
    transpose = (lambda a: a.T, lambda a: a.T)
    same = (lambda a: a, lambda a: a)
    # Row 0 of our table is the "no token" row; the file holds raw ids 0..260.
    yield (
        "char_embed",
        (261, e),
        "char_cnn.char_embedding.weight",
        lambda a: numpy.concatenate([numpy.zeros((1, e), numpy.float32), a]),
        lambda a: a[1:],
    )
    for k, (width, n) in enumerate(options.filters):
        # TF conv2d kernel (1, w, e, n) <-> Conv1d weight (n, e, w); no flip.
        yield (
            f"CNN/W_cnn_{k}",
            (1, width, e, n),
            f"char_cnn.convolutions.{k}.weight",
            lambda a: a[0].transpose(2, 1, 0),
            lambda a: a.transpose(2, 1, 0)[None],
        )
        yield (f"CNN/b_cnn_{k}", (n,), f"char_cnn.convolutions.{k}.bias", *same)
    if options.has_char_projection:
        yield ("CNN_proj/W_proj", (f, p), "char_cnn.projection.weight", *transpose)
        yield ("CNN_proj/b_proj", (p,), "char_cnn.projection.bias", *same)
    hidden = p if options.has_lstm_projection else d
    for direction, stack in enumerate(("forward_lstm", "backward_lstm")):
        for layer in range(options.n_layers):
            prefix = f"RNN_{direction}/RNN/MultiRNNCell/Cell{layer}/LSTMCell"
            key = f"{stack}.layers.{layer}"
            # W_0 stacks the input rows (P of them) over the recurrent rows.
            yield (f"{prefix}/W_0", (p + hidden, 4 * d), f"{key}.W_0", *same)
            yield (f"{prefix}/B", (4 * d,), f"{key}.bias", *same)
            if options.has_lstm_projection:
                yield (f"{prefix}/W_P_0", (d, p), f"{key}.projection_weight", *transpose)


def expected_datasets(options: BiLMOptions) -> dict[str, tuple[int, ...]]:
    """Every dataset a bilm-tf weights file for these options holds, with its shape."""
    shapes = {name: shape for name, shape, *_ in _conversions(options)}
    f = options.n_filters
    for h in range(options.n_highway):
        for part in ("transform", "carry"):
            shapes[f"CNN_high_{h}/W_{part}"] = (f, f)
            shapes[f"CNN_high_{h}/b_{part}"] = (f,)
    return shapes


def read_datasets(
    weight_file: Path, options: BiLMOptions, described_by: str
) -> Iterator[tuple[str, numpy.ndarray]]:
    """Each dataset of a bilm-tf weights file for `options` (`described_by` names them), read,
    checked and yielded in turn (a caller keeps what it needs); ValueError naming the file and
    dataset on any problem."""
    import h5py

    if not weight_file.exists():
        raise MissingFileError(2, "ELMo weights file does not exist", str(weight_file))
    expected = expected_datasets(options)
    source = f"weights file {weight_file}"
    try:
        # h5py's finalizers would lose a stop raised inside them (corpus.embed_file.hdf5_written)
        with deferred(), h5py.File(weight_file, "r") as hdf5:
            names: list[str] = []  # of every group and dataset in the file
            hdf5.visit(names.append)
            found = {name: hdf5[name] for name in names if isinstance(hdf5[name], h5py.Dataset)}
            if not set(found) & set(expected):
                raise ValueError(
                    f"{source} has no dataset 'char_embed' nor any other of bilm-tf's: is this "
                    f"an ELMo weights file?"
                )
            shapes = {name: dataset.shape for name, dataset in found.items()}
            check_shapes(shapes, expected, source, described_by, "dataset")
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
    for name, _, key, to_torch, _ in _conversions(options):
        value = to_torch(arrays.pop(name))
        if key.endswith(".W_0"):
            cell = key[: -len(".W_0")]
            state[f"{cell}.input_weight"] = _tensor(value[: options.projection_dim].T)
            state[f"{cell}.recurrent_weight"] = _tensor(value[options.projection_dim :].T)
        else:
            state[key] = _tensor(value)
    for h in range(options.n_highway):
        high = f"CNN_high_{h}"
        transform, carry = arrays.pop(f"{high}/W_transform"), arrays.pop(f"{high}/W_carry")
        state[f"char_cnn.highways.{h}.weight"] = _tensor(numpy.concatenate([transform.T, carry.T]))
        state[f"char_cnn.highways.{h}.bias"] = _tensor(
            numpy.concatenate([arrays.pop(f"{high}/b_transform"), arrays.pop(f"{high}/b_carry")])
        )
    return options, state


def _tensor(array: numpy.ndarray) -> torch.Tensor:
    """A tensor sharing `array`'s memory (a copy only where it is not contiguous)."""
    return torch.from_numpy(numpy.ascontiguousarray(array))


def write_allennlp(
    options: BiLMOptions,
    state_dict: dict[str, torch.Tensor],
    options_file: str | Path,
    weight_file: str | Path,
) -> None:
    """Write options.json and a float32 hdf5 with the dataset names of bilm-tf's dump_weights."""
    import h5py

    state = {k: v.detach().float().cpu().numpy() for k, v in state_dict.items()}
    for stack in ("forward_lstm", "backward_lstm"):
        for layer in range(options.n_layers):
            key = f"{stack}.layers.{layer}"
            state[f"{key}.W_0"] = numpy.concatenate(
                [state[f"{key}.input_weight"].T, state[f"{key}.recurrent_weight"].T]
            )
    datasets = {
        name: from_torch(state[key]) for name, _, key, _, from_torch in _conversions(options)
    }
    f = options.n_filters
    for h in range(options.n_highway):
        weight, bias = state[f"char_cnn.highways.{h}.weight"], state[f"char_cnn.highways.{h}.bias"]
        datasets[f"CNN_high_{h}/W_transform"] = weight[:f].T
        datasets[f"CNN_high_{h}/W_carry"] = weight[f:].T
        datasets[f"CNN_high_{h}/b_transform"] = bias[:f]
        datasets[f"CNN_high_{h}/b_carry"] = bias[f:]
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
    found = {key: tuple(tensor.shape) for key, tensor in state.items()}
    check_shapes(found, shapes, str(weights_path), str(weights_path.parent / CONFIG_NAME))
    check_weights(state, str(weights_path))
    return state
