"""Docs -> biLM layers: the Thinc model of the `elmo` component.

Each doc is cut into units (its sentences when it has sentence boundaries, else windows of
at most `max_tokens`; sentences longer than that are windowed too). Whitespace tokens are
not fed to the biLM and get zero vectors. Units are batched by padded token count, longest
first, so the only float arrays that grow with the document are the per-doc results.

Frozen (the default, as in the paper): no autograd through the biLM, and the layers of each
unit are kept in a bounded cache keyed by its tokens, so later epochs do not run the biLM.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

from spacy.tokens import Doc
from thinc.api import Model
from thinc.types import Floats3d

from ..bilm import BiLM, BiLMOptions, batch_to_ids
from ..bilm.lstm import unstack_small_kernels
from .bilm_wrapper import bilm_layer, torch_bilm

STORE_DTYPES = ("float32", "float16")
_process_id = os.getpid()


def _fork_safe_threads() -> None:
    """In a forked child (spaCy's `nlp.pipe(n_process=N)`), use one torch thread.

    The OpenMP pool the parent already started does not survive `fork`: the child's first
    multi-threaded GEMM would wait for it forever.
    """
    global _process_id
    if os.getpid() != _process_id:
        import torch

        torch.set_num_threads(1)
        _process_id = os.getpid()


@dataclass
class Unit:
    """One biLM input sequence: token positions of one doc and their texts."""

    doc: int
    positions: Sequence[int]
    words: Tuple[str, ...]


class LayerCache:
    """LRU cache of unit layers keyed by the unit's words, bounded by the tokens it holds."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.n_tokens = 0
        self.entries: OrderedDict[Tuple[str, ...], Floats3d] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, key: Tuple[str, ...]) -> Optional[Floats3d]:
        value = self.entries.get(key)
        if value is None:
            self.misses += 1
            return None
        self.hits += 1
        self.entries.move_to_end(key)
        return value

    def put(self, key: Tuple[str, ...], value: Floats3d) -> None:
        if len(key) > self.max_tokens or key in self.entries:
            return
        self.entries[key] = value
        self.n_tokens += len(key)
        while self.n_tokens > self.max_tokens:
            old_key, _ = self.entries.popitem(last=False)
            self.n_tokens -= len(old_key)

    def clear(self) -> None:
        self.entries.clear()
        self.n_tokens = 0


def elmo_model(
    options: BiLMOptions,
    *,
    max_tokens: int = 256,
    batch_tokens: int = 4096,
    frozen: bool = True,
    grad_factor: float = 1.0,
    cache_tokens: int = 1_000_000,
    store_dtype: str = "float32",
) -> Model[List[Doc], List[Floats3d]]:
    """Thinc model mapping docs to one (L + 1, n_tokens, 2P) array each."""
    if store_dtype not in STORE_DTYPES:
        raise ValueError(f"store_dtype must be one of {STORE_DTYPES}, got {store_dtype!r}")
    if max_tokens < 1 or batch_tokens < max_tokens + 2:
        raise ValueError(
            f"need max_tokens >= 1 and batch_tokens >= max_tokens + 2, got max_tokens="
            f"{max_tokens}, batch_tokens={batch_tokens}"
        )
    return Model(
        "elmo",
        forward,
        layers=[bilm_layer(BiLM(options))],
        dims={"nO": options.output_dim, "n_layers": options.n_layers + 1},
        attrs={
            "max_tokens": max_tokens,
            "batch_tokens": batch_tokens,
            "frozen": frozen,
            "grad_factor": grad_factor,
            "store_dtype": store_dtype,
            "weights_loaded": False,
            "cache": LayerCache(cache_tokens if frozen else 0),
            "bilm_tokens": 0,  # tokens run through the biLM (for tests and benchmarks)
        },
    )


def ensure_weights(model: Model) -> None:
    """Load the default weights (`attrs["default_weights"]`) if none were loaded yet."""
    if model.attrs["weights_loaded"]:
        return
    load_default = model.attrs.get("default_weights")
    if load_default is None:
        raise ValueError(
            "the elmo model has no weights: initialize the pipeline with a weights loader "
            "([initialize.components.elmo.weights], e.g. spacy_elmo.AllenNLPWeights.v1)"
        )
    set_weights(model, load_default(), source="the default (bundled) biLM")


def set_weights(model: Model, bilm: BiLM, source: str) -> None:
    """Copy `bilm`'s weights into the model; ValueError when its architecture differs."""
    target = get_bilm(model)
    if bilm.options != target.options:
        configured, given = target.options.to_dict(), bilm.options.to_dict()
        diffs = [
            f"{section}.{key}: config {configured[section].get(key)!r}, weights "
            f"{given[section].get(key)!r}"
            for section in ("char_cnn", "lstm")
            for key in sorted(set(configured[section]) | set(given[section]))
            if configured[section].get(key) != given[section].get(key)
        ]
        raise ValueError(
            f"the weights from {source} do not match the elmo model's configuration: "
            + "; ".join(diffs)
        )
    target.load_state_dict(bilm.state_dict())
    model.attrs["cache"].clear()
    model.attrs["weights_loaded"] = True


def get_bilm(model: Model) -> BiLM:
    """The torch biLM of an `elmo_model`."""
    return torch_bilm(model.layers[0])


def doc_units(doc: Doc, index: int, max_tokens: int) -> List[Unit]:
    """The biLM inputs of one doc: sentences (or the doc) in windows, whitespace dropped."""
    spans = doc.sents if doc.has_annotation("SENT_START") else [doc[:]]
    units = []
    for span in spans:
        positions = [token.i for token in span if not token.is_space]
        for start in range(0, len(positions), max_tokens):
            window = positions[start : start + max_tokens]
            units.append(Unit(index, window, tuple(doc[i].text for i in window)))
    return units


def batches_by_tokens(units: List[Unit], batch_tokens: int) -> List[List[Unit]]:
    """Longest first; a batch's padded size (rows x (longest + 2)) stays within batch_tokens."""
    ordered = sorted(units, key=lambda unit: -len(unit.words))
    batches: List[List[Unit]] = []
    for unit in ordered:
        if batches and (len(batches[-1]) + 1) * (len(batches[-1][0].words) + 2) <= batch_tokens:
            batches[-1].append(unit)
        else:
            batches.append([unit])
    return batches


def forward(
    model: Model[List[Doc], List[Floats3d]], docs: List[Doc], is_train: bool
) -> Tuple[List[Floats3d], Callable]:
    ops = model.ops
    layer = model.layers[0]
    options = get_bilm(model).options
    n_layers, width = options.n_layers + 1, options.output_dim
    store_dtype = model.attrs["store_dtype"]
    frozen = model.attrs["frozen"]
    cache: LayerCache = model.attrs["cache"]
    # Only training docs are cached: they come back every epoch, and at inference a cache
    # would double the memory of a long document.
    use_cache = frozen and is_train and cache.max_tokens > 0
    _fork_safe_threads()
    ensure_weights(model)
    outputs = [ops.xp.zeros((n_layers, len(doc), width), dtype=store_dtype) for doc in docs]

    pending = []
    for index, doc in enumerate(docs):
        for unit in doc_units(doc, index, model.attrs["max_tokens"]):
            cached = cache.get(unit.words) if use_cache else None
            if cached is None:
                pending.append(unit)
            else:
                outputs[unit.doc][:, unit.positions] = cached

    backprops = []
    for batch in batches_by_tokens(pending, model.attrs["batch_tokens"]):
        char_ids = ops.asarray(batch_to_ids([unit.words for unit in batch]).numpy())
        model.attrs["bilm_tokens"] += sum(len(unit.words) for unit in batch)
        if frozen or not is_train:
            layers = layer.predict(char_ids)  # (L + 1, rows, time, 2P), no autograd
        else:
            # Fine-tuning: thinc's optimiser writes contiguous weights back after each step,
            # so the weights' gradients must have that layout from the first step on.
            bilm = get_bilm(model)
            unstack_small_kernels((bilm.forward_lstm, bilm.backward_lstm))
            layers, backprop_batch = layer.begin_update(char_ids)
            backprops.append((batch, backprop_batch, layers.shape))
        for row, unit in enumerate(batch):
            values = layers[:, row, : len(unit.words)].astype(store_dtype)  # (L + 1, n, 2P)
            outputs[unit.doc][:, unit.positions] = values
            if use_cache:
                cache.put(unit.words, values)

    def backprop(d_outputs: List[Floats3d]) -> List[Doc]:
        factor = model.attrs["grad_factor"]
        for batch, backprop_batch, shape in backprops:
            d_layers = ops.alloc(shape, dtype="float32")
            for row, unit in enumerate(batch):
                d_layers[:, row, : len(unit.words)] = d_outputs[unit.doc][:, unit.positions]
            if factor != 1.0:
                d_layers *= factor
            backprop_batch(d_layers)
        return []

    return outputs, backprop
