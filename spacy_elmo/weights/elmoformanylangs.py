"""ELMoForManyLangs (HIT-SCIR, CoNLL 2018) model directories read into a `BiLM`: their ids,
gates and highway gate mapped onto the bilm-tf layout, as their code (`elmoformanylangs`
0.0.4.post2) computes them (docs/languages.md lists what differs). The `.pkl` state dicts are
read with `torch.load(weights_only=True)`, which never runs code."""

from __future__ import annotations

import copy
import logging
import warnings
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, Callable, Iterator

import torch

from ..description.options import BiLMOptions
from ..util.json_files import MissingFileError, read_json
from .efml_lexicon import EfmlLexicon, read_dictionary
from .tensors import check_shapes, check_weights, read_torch_file

logger = logging.getLogger(__name__)

CONFIG_NAME = "config.json"
CHAR_DICTIONARY = "char.dic"
WORD_DICTIONARY = "word.dic"
TOKEN_EMBEDDER_WEIGHTS = "token_embedder.pkl"
ENCODER_WEIGHTS = "encoder.pkl"

# The architecture of every published model (the parts of their package's configs/ read here),
# for a model directory whose config.json names a file that is not in it (their README; issue
# 27 of github.com/HIT-SCIR/ELMoForManyLangs).
PUBLISHED_ARCHITECTURE: dict[str, Any] = {
    "encoder": {
        "name": "elmo",
        "projection_dim": 512,
        "cell_clip": 3,
        "proj_clip": 3,
        "dim": 4096,
        "n_layers": 2,
    },
    "token_embedder": {
        "name": "cnn",
        "activation": "relu",
        "filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]],
        "n_highway": 2,
        "word_dim": 100,
        "char_dim": 50,
        "max_characters_per_token": 50,
    },
}
PUBLISHED_ARCHITECTURE_NAMES = (
    "cnn_50_100_512_4096_sample.json",
    "cnn_0_100_512_4096_sample.json",
)


# ---------------------------------------------------------------------- weights
def load_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """A PyTorch state dict read without running code (`torch.load(weights_only=True)`)."""
    state = read_torch_file(path, "ELMoForManyLangs weights file")
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise ValueError(f"{path} is not a state dict (a mapping of names to tensors)")
    return dict(state)


def _reorder_gates(tensor: torch.Tensor) -> torch.Tensor:
    """AllenNLP's gate blocks i, f, g, o -> bilm-tf's i, j (= g), f, o (first axis)."""
    i, f, g, o = tensor.chunk(4, dim=0)
    return torch.cat([i, g, f, o])


def _gate_bias(bias: torch.Tensor) -> torch.Tensor:
    """Their LSTM bias in the bilm-tf order, less the forget bias of 1 that the cell adds."""
    i, j, f, o = _reorder_gates(bias).chunk(4)
    return torch.cat([i, j, f - 1.0, o])


def _highway_gate(tensor: torch.Tensor) -> torch.Tensor:
    """AllenNLP: x <- g x + (1 - g) relu(A x), g = sigmoid(B x); ours gates the transform
    branch with t = sigmoid(-B x) = 1 - g, so the B half (rows f:) is negated."""
    transform, gate = tensor.chunk(2)
    return torch.cat([transform, -gate])


def _with_no_token_row(table: torch.Tensor) -> torch.Tensor:
    """Prepend the id-0 ("no token") row of zeros."""
    return torch.cat([table.new_zeros((1, table.shape[1])), table])


def _same(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _conversions(
    options: BiLMOptions,
) -> Iterator[tuple[str, str, tuple[int, ...], str, Callable]]:
    """(their file, their key, its shape, our key, theirs -> ours) for every tensor."""
    e, f = options.char_embedding_dim, options.n_filters
    p, d = options.projection_dim, options.lstm_dim
    embedder, word_dim = TOKEN_EMBEDDER_WEIGHTS, options.word_embedding_dim
    tables = [("char", options.n_characters - 1, e)]
    if word_dim:
        tables.append(("word", options.n_words - 1, word_dim))
    for kind, rows, dim in tables:
        key = f"{kind}_emb_layer.embedding.weight"
        ours = f"char_cnn.{kind}_embedding.weight"
        yield embedder, key, (rows, dim), ours, _with_no_token_row
    for k, (width, n) in enumerate(options.filters):
        for name, shape in (("weight", (n, e, width)), ("bias", (n,))):
            key = f"convolutions.{k}.{name}"
            yield embedder, key, shape, f"char_cnn.{key}", _same
    for h in range(options.n_highway):
        for name, shape in (("weight", (2 * f, f)), ("bias", (2 * f,))):
            key = f"highways._layers.{h}.{name}"
            yield embedder, key, shape, f"char_cnn.highways.{h}.{name}", _highway_gate
    for name, shape in (("weight", (p, word_dim + f)), ("bias", (p,))):
        yield embedder, f"projection.{name}", shape, f"char_cnn.projection.{name}", _same
    for direction in ("forward", "backward"):
        for layer in range(options.n_layers):
            theirs, ours = f"{direction}_layer_{layer}", f"{direction}_lstm.layers.{layer}"
            for key, shape, our_key, convert in (
                ("input_linearity.weight", (4 * d, p), "input_weight", _reorder_gates),
                ("state_linearity.weight", (4 * d, p), "recurrent_weight", _reorder_gates),
                ("state_linearity.bias", (4 * d,), "bias", _gate_bias),
                ("state_projection.weight", (p, d), "projection_weight", _same),
            ):
                yield ENCODER_WEIGHTS, f"{theirs}.{key}", shape, f"{ours}.{our_key}", convert


def convert_state_dicts(
    options: BiLMOptions, model_dir: Path, states: dict[str, dict[str, torch.Tensor]]
) -> dict[str, torch.Tensor]:
    """Their state dicts, by file name (key names of their modules) -> a `BiLM` state dict."""
    expected: dict[str, dict[str, tuple[int, ...]]] = {name: {} for name in states}
    for file_name, key, shape, _, _ in _conversions(options):
        expected[file_name][key] = shape
    for file_name, state in states.items():
        source = f"weights file {model_dir / file_name}"
        # Checked as stored, before the cast to float32 (which would drop an imaginary part).
        check_weights(state, source)
        check_shapes(state, expected[file_name], source, "the config")
    return {
        ours: convert(states[file_name][key].detach().to(torch.float32))
        for file_name, key, _, ours, convert in _conversions(options)
    }


# ---------------------------------------------------------------------- the model directory
# The files of a model directory (word.dic only with a word embedding); any of them marks one.
WEIGHTS_FILES = (TOKEN_EMBEDDER_WEIGHTS, ENCODER_WEIGHTS)
MODEL_FILES = (CONFIG_NAME, CHAR_DICTIONARY, *WEIGHTS_FILES)
MARKERS = (CHAR_DICTIONARY, WORD_DICTIONARY, TOKEN_EMBEDDER_WEIGHTS, ENCODER_WEIGHTS)


def is_elmoformanylangs_dir(path: str | Path) -> bool:
    """Whether `path` looks like an ELMoForManyLangs model directory: it holds one of their
    dictionaries or state dicts, or a config.json naming an architecture (`config_path`), even
    when other files are missing (their loader then names those)."""
    path = Path(path)
    if any((path / name).exists() for name in MARKERS):
        return True
    try:
        config = read_json(path / CONFIG_NAME, "config")
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "config_path" in config and "format" not in config


def check_model_files(model_dir: Path) -> None:
    """MissingFileError naming the files of every ELMoForManyLangs model that `model_dir` lacks."""
    missing = [name for name in MODEL_FILES if not (model_dir / name).is_file()]
    if missing:
        raise MissingFileError(
            2,
            f"ELMoForManyLangs model directory {model_dir} lacks {', '.join(missing)} (a model "
            f"holds {', '.join(MODEL_FILES)}, the architecture JSON its config.json names and, "
            f"with a word embedding, {WORD_DICTIONARY})",
            str(model_dir / missing[0]),
        )


def _climbs_out(name: str) -> bool:
    """Whether a path written in a config leaves the folder it is read from."""
    paths = (PurePosixPath(name), PureWindowsPath(name))
    return any(p.is_absolute() or p.anchor or ".." in p.parts for p in paths)


def read_architecture(model_dir: Path) -> tuple[dict[str, Any], str]:
    """The architecture JSON named by `config.json`'s `config_path`, and which file it was.

    A model directory is read only from inside itself: a relative `config_path` is looked up in
    it, and one that is absolute or climbs out with `..` (the published models name a path on
    the machine they were trained on) by its file name in it; then, for the name of a published
    architecture, their packaged copy.
    """
    config_file = model_dir / CONFIG_NAME
    config = read_json(config_file, "ELMoForManyLangs config")
    config_path = config.get("config_path") if isinstance(config, dict) else None
    if not isinstance(config_path, str) or not config_path.strip():
        raise ValueError(
            f"{config_file} has no 'config_path' naming the architecture JSON "
            f"(such as cnn_50_100_512_4096_sample.json); is this an ELMoForManyLangs model?"
        )
    name = PureWindowsPath(config_path).name  # the last part, after / or \\
    candidates = [model_dir / name] if name not in ("", ".", "..") else []
    if not _climbs_out(config_path):
        candidates.insert(0, model_dir / config_path)
    for candidate in candidates:
        if candidate.is_file():
            source = str(candidate)
            if candidate != model_dir / config_path:
                logger.info("%s names %r; reading %s", config_file, config_path, candidate)
                source = f"{candidate} (config.json names {config_path!r})"
            return read_json(candidate, "ELMoForManyLangs architecture"), source
    if name in PUBLISHED_ARCHITECTURE_NAMES:
        warnings.warn(
            f"{config_file} names the architecture {config_path!r}, which is not in "
            f"{model_dir}; using the published {name} of ELMoForManyLangs",
            stacklevel=3,
        )
        return copy.deepcopy(PUBLISHED_ARCHITECTURE), f"the published {name}"
    outside = " (a model directory is read only from inside itself)" * _climbs_out(config_path)
    tried = ", ".join(str(c) for c in candidates)
    raise FileNotFoundError(
        f"{config_file} names the architecture {config_path!r}, which is not there (tried "
        f"{tried}){outside}; copy the architecture JSON into {model_dir}"
    )


def architecture_options(
    architecture: dict[str, Any], n_characters: int, n_words: int, source: str
) -> BiLMOptions:
    """Their architecture JSON as `BiLMOptions` (tables of n rows get the id-0 row added)."""
    if not isinstance(architecture, dict):
        raise ValueError(f"{source}: expected a JSON object")
    encoder, embedder = architecture.get("encoder"), architecture.get("token_embedder")
    if not isinstance(encoder, dict) or not isinstance(embedder, dict):
        raise ValueError(f"{source}: missing the 'encoder' or 'token_embedder' object")
    for key, section, name, what in (
        ("encoder", encoder, "elmo", "the ELMo encoder"),
        ("token_embedder", embedder, "cnn", "the character CNN"),
    ):
        if str(section.get("name", "")).lower() != name:
            raise ValueError(
                f"{source}: {key} '{section.get('name')}' is not supported; spacy-elmo reads "
                f'{what} ("name": "{name}") of the published models'
            )
    word_dim = embedder.get("word_dim", 0) or 0
    options = {
        "char_cnn": {
            "char_vocabulary": "dictionary",
            "n_characters": n_characters + 1,
            "embedding": {"dim": embedder.get("char_dim")},
            "filters": embedder.get("filters"),
            "n_highway": embedder.get("n_highway", 0),
            "activation": embedder.get("activation", "relu"),
            "max_characters_per_token": embedder.get("max_characters_per_token"),
        },
        "lstm": {
            "dim": encoder.get("dim"),
            "projection_dim": encoder.get("projection_dim"),
            "n_layers": encoder.get("n_layers"),
            "cell_clip": encoder.get("cell_clip"),
            "proj_clip": encoder.get("proj_clip"),
            "use_skip_connections": True,  # their ElmobiLm adds the input of layers >= 1
        },
    }
    if word_dim:
        options["char_cnn"]["word_embedding"] = {"dim": word_dim, "n_words": n_words + 1}
    for key in ("dim", "projection_dim", "n_layers"):
        if encoder.get(key) is None:
            raise ValueError(f"{source}: missing required key 'encoder.{key}'")
    parsed = BiLMOptions.from_dict(options, source=source)
    if not parsed.has_lstm_projection:
        raise ValueError(
            f"{source}: 'encoder.projection_dim' must be smaller than 'encoder.dim' (their cell "
            f"always projects; spacy-elmo's projects only then)"
        )
    return parsed


def read_elmoformanylangs(
    model_dir: str | Path,
) -> tuple[BiLMOptions, dict[str, torch.Tensor], EfmlLexicon]:
    """Options, a `BiLM` state dict and the lexicon of an ELMoForManyLangs model directory."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise MissingFileError(2, "ELMoForManyLangs model directory does not exist", str(model_dir))
    check_model_files(model_dir)
    architecture, source = read_architecture(model_dir)
    embedder = architecture.get("token_embedder") if isinstance(architecture, dict) else None
    word_dim = embedder.get("word_dim", 0) if isinstance(embedder, dict) else 0
    embedder_file = model_dir / TOKEN_EMBEDDER_WEIGHTS
    states = {name: load_state_dict(model_dir / name) for name in WEIGHTS_FILES}
    # The table sizes are the weights' (as their EmbeddingLayer, len(dictionary) rows); every id
    # of a dictionary is checked against them as it is read.
    rows, dictionaries = {"word": 0}, {"word": None}
    tables = [("char", CHAR_DICTIONARY, "character")]
    if word_dim:
        tables.append(("word", WORD_DICTIONARY, "word"))
    for kind, dictionary, what in tables:
        key = f"{kind}_emb_layer.embedding.weight"
        table = states[TOKEN_EMBEDDER_WEIGHTS].get(key)
        if table is None:
            raise ValueError(
                f"weights file {embedder_file} has no tensor '{key}' required by {source}"
            )
        rows[kind] = table.shape[0] if table.dim() == 2 else 0
        table_name = f"the {what} embedding of {embedder_file}"
        dictionaries[kind] = read_dictionary(model_dir / dictionary, rows[kind] or None, table_name)
    options = architecture_options(
        architecture, rows["char"], rows["word"], f"architecture {source}"
    )
    try:
        lexicon = EfmlLexicon(dictionaries["char"], dictionaries["word"])
    except ValueError as err:
        raise ValueError(f"ELMoForManyLangs model {model_dir}: {err}") from None
    state = convert_state_dicts(options, model_dir, states)
    return options, state, lexicon
