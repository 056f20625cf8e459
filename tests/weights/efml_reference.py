"""ELMoForManyLangs models for the tests: random weights in their layout, and their forward pass.

`write_model` writes a model directory as their training code does (config.json naming the
architecture JSON, char.dic / word.dic, `token_embedder.pkl` / `encoder.pkl` state dicts with
the key names of their modules). `reference_layers` is an independent NumPy (float64)
re-implementation of their inference, written from `elmoformanylangs` 0.0.4.post2
(`elmo.read_list`, `frontend.create_one_batch`, `modules/token_embedder.ConvTokenEmbedder`,
`modules/highway.Highway`, `modules/elmo.ElmobiLm`, `modules/lstm_cell_with_projection`,
`frontend.Model.forward`, `Embedder.sents2elmo`); it shares no code with spacy_elmo.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy
import torch

CHAR_SPECIALS = ["<bos>", "<eos>", "<oov>", "<pad>", "<bow>", "<eow>"]
WORD_SPECIALS = ["<oov>", "<bos>", "<eos>", "<pad>"]


def architecture(word_dim: int, **changes) -> dict:
    """A tiny architecture JSON in their format."""
    arch = {
        "encoder": {
            "name": "elmo",
            "projection_dim": 6,
            "cell_clip": 1.5,
            "proj_clip": 0.8,
            "dim": 10,
            "n_layers": 2,
        },
        "token_embedder": {
            "name": "cnn",
            "activation": "relu",
            "filters": [[1, 4], [2, 6], [3, 8]],
            "n_highway": 2,
            "word_dim": word_dim,
            "char_dim": 4,
            "max_characters_per_token": 50,
        },
        "classifier": {"name": "sampled_softmax", "n_samples": 8192},
        "dropout": 0.1,
    }
    for section, values in changes.items():
        arch[section].update(values)
    return arch


def dictionaries(training_text: list[list[str]]) -> tuple[dict, dict]:
    """char2id / word2id built in the order of their biLM.py (chars seen, then specials)."""
    chars: dict[str, int] = {}
    for sentence in training_text:
        for word in sentence:
            for ch in word:
                chars.setdefault(ch, len(chars))
    for special in CHAR_SPECIALS:
        chars.setdefault(special, len(chars))
    words: dict[str, int] = {}
    for special in WORD_SPECIALS:
        words.setdefault(special, len(words))
    for sentence in training_text:
        for word in sentence:
            words.setdefault(word, len(words))
    return chars, words


def random_state_dicts(arch: dict, n_chars: int, n_words: int, seed: int) -> tuple[dict, dict]:
    """token_embedder / encoder state dicts with their modules' key names, random values."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=0.6):
        return torch.randn(*shape, generator=gen) * scale

    emb, enc = arch["token_embedder"], arch["encoder"]
    e, p, d = emb["char_dim"], enc["projection_dim"], enc["dim"]
    n_filters = sum(n for _, n in emb["filters"])
    token_embedder = {}
    if emb["word_dim"]:
        token_embedder["word_emb_layer.embedding.weight"] = rand(n_words, emb["word_dim"])
    token_embedder["char_emb_layer.embedding.weight"] = rand(n_chars, e)
    for k, (width, n) in enumerate(emb["filters"]):
        token_embedder[f"convolutions.{k}.weight"] = rand(n, e, width)
        token_embedder[f"convolutions.{k}.bias"] = rand(n, scale=0.2)
    for h in range(emb["n_highway"]):
        token_embedder[f"highways._layers.{h}.weight"] = rand(2 * n_filters, n_filters, scale=0.3)
        token_embedder[f"highways._layers.{h}.bias"] = rand(2 * n_filters, scale=0.5)
    token_embedder["projection.weight"] = rand(p, emb["word_dim"] + n_filters, scale=0.4)
    token_embedder["projection.bias"] = rand(p, scale=0.2)
    encoder = {}
    for layer in range(enc["n_layers"]):
        for direction in ("forward", "backward"):
            prefix = f"{direction}_layer_{layer}"
            encoder[f"{prefix}.input_linearity.weight"] = rand(4 * d, p)
            encoder[f"{prefix}.state_linearity.weight"] = rand(4 * d, p)
            encoder[f"{prefix}.state_linearity.bias"] = rand(4 * d, scale=0.5)
            encoder[f"{prefix}.state_projection.weight"] = rand(p, d)
    return token_embedder, encoder


def write_model(
    directory: Path,
    arch: dict,
    chars: dict,
    words: dict,
    seed: int = 0,
    config_path: str = "cnn_tiny.json",
    extra_char_lines: tuple[str, ...] = (),
) -> dict[str, numpy.ndarray]:
    """Write a model directory in their layout; return both state dicts' tensors (float64)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(
        json.dumps({"config_path": config_path, "model": str(directory)}), encoding="utf-8"
    )
    (directory / Path(config_path).name).write_text(json.dumps(arch), encoding="utf-8")
    # Written as their biLM.py writes them: print('{0}\t{1}'.format(token, id)).
    char_lines = [f"{c}\t{i}" for c, i in chars.items()] + list(extra_char_lines)
    (directory / "char.dic").write_text("\n".join(char_lines) + "\n", encoding="utf-8")
    (directory / "word.dic").write_text(
        "".join(f"{w}\t{i}\n" for w, i in words.items()), encoding="utf-8"
    )
    n_chars = len(read_dic(directory / "char.dic"))
    token_embedder, encoder = random_state_dicts(arch, n_chars, len(words), seed)
    torch.save(token_embedder, directory / "token_embedder.pkl")
    torch.save(encoder, directory / "encoder.pkl")
    return {k: v.double().numpy() for k, v in {**token_embedder, **encoder}.items()}


def read_dic(path: Path) -> dict[str, int]:
    """Their Embedder.get_model's reading of char.dic / word.dic."""
    lexicon = {}
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            tokens = line.strip().split("\t")
            if len(tokens) == 1:
                tokens.insert(0, "\u3000")
            token, i = tokens
            lexicon[token] = int(i)
    return lexicon


# ---------------------------------------------------------------------- their inference
def their_ids(sentence: list[str], char2id: dict, word2id: dict | None, max_chars: int):
    """read_list + create_one_batch for one sentence: (n + 2, max_chars) char ids, word ids."""
    data = ["<bos>"]
    for token in sentence:
        if len(token) + 2 > max_chars:
            token = token[: max_chars - 2]
        data.append(token)
    data.append("<eos>")
    # (sic) bow_id, eow_id = char2id['<eow>'], char2id['<bow>']
    bow_id, eow_id = char2id["<eow>"], char2id["<bow>"]
    oov_id, pad_id = char2id["<oov>"], char2id["<pad>"]
    chars = numpy.full((len(data), max_chars), pad_id, dtype=numpy.int64)
    for j, token in enumerate(data):
        chars[j, 0] = bow_id
        if token in ("<bos>", "<eos>"):
            chars[j, 1] = char2id[token]
            chars[j, 2] = eow_id
        else:
            for k, c in enumerate(token):
                chars[j, k + 1] = char2id.get(c, oov_id)
            chars[j, len(token) + 1] = eow_id
    words = None
    if word2id is not None:
        words = numpy.array([word2id.get(t, word2id["<oov>"]) for t in data], dtype=numpy.int64)
    return chars, words


def _sigmoid(x):
    return 1.0 / (1.0 + numpy.exp(-x))


def _token_embedder(w: dict, arch: dict, chars, words):
    """ConvTokenEmbedder.forward: (n, max_chars) ids -> (n, P)."""
    emb = arch["token_embedder"]
    x = w["char_emb_layer.embedding.weight"][chars]  # (n, max_chars, e)
    activation = numpy.tanh if emb["activation"] == "tanh" else (lambda v: numpy.maximum(v, 0))
    convs = []
    for k, (width, _) in enumerate(emb["filters"]):
        kernel, bias = w[f"convolutions.{k}.weight"], w[f"convolutions.{k}.bias"]  # (o, e, w)
        positions = x.shape[1] - width + 1
        out = (
            numpy.stack(
                [
                    numpy.einsum("nwe,oew->no", x[:, p : p + width], kernel)
                    for p in range(positions)
                ],
                axis=-1,
            )
            + bias[None, :, None]
        )  # (n, o, positions)
        convs.append(activation(out.max(axis=-1)))  # max over positions, then activation
    h = numpy.concatenate(convs, axis=-1)
    n_filters = h.shape[-1]
    for layer in range(emb["n_highway"]):
        projected = (
            h @ w[f"highways._layers.{layer}.weight"].T + w[f"highways._layers.{layer}.bias"]
        )
        nonlinear = numpy.maximum(projected[:, :n_filters], 0)
        gate = _sigmoid(projected[:, n_filters:])
        h = gate * h + (1 - gate) * nonlinear
    parts = [h]
    if words is not None:
        parts.insert(0, w["word_emb_layer.embedding.weight"][words])
    token = numpy.concatenate(parts, axis=-1)
    return token @ w["projection.weight"].T + w["projection.bias"]


def _cell(w: dict, prefix: str, inputs, go_forward: bool, cell_clip, proj_clip):
    """LstmCellWithProjection.forward for one sequence from a zero state: (T, in) -> (T, P)."""
    wi = w[f"{prefix}.input_linearity.weight"]
    ws, bs = w[f"{prefix}.state_linearity.weight"], w[f"{prefix}.state_linearity.bias"]
    wp = w[f"{prefix}.state_projection.weight"]
    cell_size, hidden = wi.shape[0] // 4, wp.shape[0]
    memory, state = numpy.zeros(cell_size), numpy.zeros(hidden)
    outputs = numpy.zeros((inputs.shape[0], hidden))
    steps = range(inputs.shape[0]) if go_forward else reversed(range(inputs.shape[0]))
    for t in steps:
        z = wi @ inputs[t] + ws @ state + bs
        i, f, g, o = (z[k * cell_size : (k + 1) * cell_size] for k in range(4))
        memory = _sigmoid(i) * numpy.tanh(g) + _sigmoid(f) * memory
        if cell_clip:
            memory = numpy.clip(memory, -cell_clip, cell_clip)
        state = wp @ (_sigmoid(o) * numpy.tanh(memory))
        if proj_clip:
            state = numpy.clip(state, -proj_clip, proj_clip)
        outputs[t] = state
    return outputs


def reference_layers(
    w: dict, arch: dict, sentence: list[str], char2id: dict, word2id: dict | None
) -> numpy.ndarray:
    """Embedder.sents2elmo(output_layer=-2) for one sentence: (L + 1, n, 2P) float64."""
    emb, enc = arch["token_embedder"], arch["encoder"]
    chars, words = their_ids(
        sentence, char2id, word2id if emb["word_dim"] else None, emb["max_characters_per_token"]
    )
    token = _token_embedder(w, arch, chars, words)  # (n + 2, P)
    layers = [numpy.concatenate([token, token], axis=-1)]
    forward, backward = token, token
    for layer in range(enc["n_layers"]):
        new_forward = _cell(
            w, f"forward_layer_{layer}", forward, True, enc["cell_clip"], enc["proj_clip"]
        )
        new_backward = _cell(
            w, f"backward_layer_{layer}", backward, False, enc["cell_clip"], enc["proj_clip"]
        )
        if layer != 0:  # skip connections
            new_forward, new_backward = new_forward + forward, new_backward + backward
        forward, backward = new_forward, new_backward
        layers.append(numpy.concatenate([forward, backward], axis=-1))
    return numpy.stack(layers)[:, 1:-1]  # without <bos>/<eos>
