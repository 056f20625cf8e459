"""Docs -> biLM layers: the forward pass and weights of the `elmo` component's Thinc model (built
by `spacy_elmo.ElmoModel.v1`, `pipeline/architectures.py`).

Each doc is cut into units (its sentences, or with `split_sentences` those of spaCy's rule-based
sentencizer, in windows of at most `max_tokens`, whitespace left out), run through the biLM in
batches of padded token count, longest first. With a frozen biLM (the default) each training
unit's layers are kept in a cache bounded in tokens (and `cache_mb`), keyed by its words, so
later epochs skip the biLM; inference does not use it (it would double a long document's memory).
An architecture left open holds a `PendingBiLM` until `set_weights` fills it from the weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from spacy.attrs import IS_PUNCT, IS_SPACE, ORTH
from spacy.pipeline import Sentencizer
from spacy.tokens import Doc
from thinc.api import Model
from thinc.types import Floats3d

from ..bilm import BiLM, BiLMOptions
from ..bilm.cache import BoundedCache
from ..description.chars import batches_by_padded_tokens
from ..description.options import DICTIONARY_FIELDS, FIELDS
from .bilm_wrapper import in_place_of

# The architecture keys of spacy_elmo.ElmoModel.v1 and the options.json keys they set: every
# field of BiLMOptions but those of the character and word vocabularies (ELMo's bytes).
ARCHITECTURE_KEYS = {
    name: key
    for name, (key, _, _) in FIELDS.items()
    if name not in (*DICTIONARY_FIELDS, "n_characters")
}


@dataclass(frozen=True)
class RunSettings:
    """How the model runs, in `attrs["settings"]`: the ElmoModel.v1 config values, and how docs
    without sentence boundaries are cut (`doc_units`), which the model's one owner sets (the
    `elmo` component, or the inline ElmoMix.v1 that replaces a listener:
    `architectures.set_unit_rule`). Thinc saves no attribute that msgpack cannot write, so a
    saved model carries none of them and the config is their one owner (overrides at
    `spacy.load` hold)."""

    max_tokens: int
    batch_tokens: int
    frozen: bool
    grad_factor: float
    store_dtype: str
    split_sentences: Optional[bool] = None  # None: not set by an owner yet
    sentence_punct: Optional[Tuple[str, ...]] = None


def options_from_architecture(architecture: Dict[str, Any], source: str) -> BiLMOptions:
    """BiLMOptions from complete ElmoModel.v1 architecture values."""
    options: Dict[str, Any] = {}
    for key, path in ARCHITECTURE_KEYS.items():
        *parents, name = path.split(".")
        holder = options
        for part in parents:
            holder = holder.setdefault(part, {})
        holder[name] = architecture[key]
    return BiLMOptions.from_dict(options, source=source)


def architecture_of(options: BiLMOptions) -> Dict[str, Any]:
    """The ElmoModel.v1 config values of a biLM's options (no clipping is written as 0)."""
    values = {key: getattr(options, key) for key in ARCHITECTURE_KEYS}
    values["filters"] = [list(f) for f in options.filters]
    values["cell_clip"] = options.cell_clip or 0.0
    values["proj_clip"] = options.proj_clip or 0.0
    return values


def default_bilm() -> BiLM:
    """The biLM of a model given no weights: the English biLM that ships in the package."""
    return BiLM.load("bundled")


def ensure_weights(model: Model, X: Optional[List[Doc]] = None, Y: Any = None) -> None:
    """Load the default weights (`default_bilm`) if none were loaded yet: the model's `init`."""
    if not model.attrs["weights_loaded"]:
        set_weights(model, default_bilm(), source="the default (bundled) biLM")


def set_weights(model: Model, bilm: BiLM, source: str) -> None:
    """Put `bilm`'s weights into the model: the architecture values the config left open are
    taken from them; ValueError when a configured value differs."""
    given = architecture_of(bilm.options)
    diffs = [
        f"{ARCHITECTURE_KEYS[key]}: config {value!r}, weights {given[key]!r} ({key})"
        for key, value in model.attrs["architecture"].items()
        if value != given[key]
    ]
    if diffs:
        raise ValueError(
            f"the weights from {source} do not match the elmo model's configuration: "
            + "; ".join(diffs)
            + " (set these to null in [components.elmo.model] to take them from the weights)"
        )
    target = get_bilm(model)
    if target.options == bilm.options and target.lexicon == bilm.lexicon:
        target.load_state_dict(bilm.state_dict())
    else:  # the architecture was left open in the config: the weights decide it
        shim = model.layers[0].shims[0]
        shim._model = in_place_of(bilm, shim._model, shim.device)
        model.set_dim("nO", bilm.options.output_dim, force=True)
        model.set_dim("n_layers", bilm.options.n_layers + 1, force=True)
    model.attrs["cache"].clear()
    model.attrs["weights_loaded"] = True


def get_bilm(model: Model) -> BiLM:
    """The torch biLM of an `elmo_model` (a `PendingBiLM` before weights are known)."""
    return model.layers[0].shims[0]._model


def forward(
    model: Model[List[Doc], List[Floats3d]], docs: List[Doc], is_train: bool
) -> Tuple[List[Floats3d], Callable]:
    if not model.attrs["weights_loaded"]:
        raise ValueError(
            "the elmo model has no weights yet: initialize it first (nlp.initialize(), or "
            "model.initialize() for the Thinc model alone), or load a saved pipeline"
        )
    settings: RunSettings = model.attrs["settings"]
    if settings.split_sentences is None:
        raise ValueError(
            "the elmo model has no sentence rule: its owner sets one (the elmo component, an "
            "ElmoMix.v1; for the model alone: architectures.set_unit_rule(model, ...))"
        )
    split, punct = settings.split_sentences, settings.sentence_punct
    units = [
        unit
        for index, doc in enumerate(docs)
        for unit in doc_units(doc, index, settings.max_tokens, split, punct)
    ]
    n_layers, width = model.get_dim("n_layers"), model.get_dim("nO")  # set with the weights
    outputs = [
        model.ops.xp.zeros((n_layers, len(doc), width), dtype=settings.store_dtype) for doc in docs
    ]
    if not is_train:
        _run_bilm(model, units, outputs)
        return outputs, lambda d_outputs: []
    cache: BoundedCache = model.attrs["cache"]
    use_cache = settings.frozen and cache.max_size > 0
    pending = []
    for unit in units:
        cached = cache.get(unit.words) if use_cache else None
        if cached is None:
            pending.append(unit)
        else:
            outputs[unit.doc][:, unit.positions] = cached
    backprops = _run_bilm(
        model, pending, outputs, fine_tune=not settings.frozen, cache=cache if use_cache else None
    )

    def backprop(d_outputs: List[Floats3d]) -> List[Doc]:
        for batch, backprop_batch, shape in backprops:
            d_layers = model.ops.alloc(shape, dtype="float32")
            for row, unit in enumerate(batch):
                d_layers[:, row, : len(unit.words)] = d_outputs[unit.doc][:, unit.positions]
            if settings.grad_factor != 1.0:
                d_layers *= settings.grad_factor
            backprop_batch(d_layers)
        return []

    return outputs, backprop


def _run_bilm(
    model: Model,
    units: List[Unit],
    outputs: List[Floats3d],
    *,
    fine_tune: bool = False,
    cache: Optional[BoundedCache] = None,
) -> List[Tuple[List[Unit], Callable, Tuple[int, ...]]]:
    """Write the layers of `units` into their docs' `outputs`, the biLM run over batches of
    them (and into `cache`); with `fine_tune`, with autograd: each batch's backprop."""
    layer = model.layers[0]
    settings: RunSettings = model.attrs["settings"]
    bilm_ids = get_bilm(model)  # its token -> id mapping (UTF-8 bytes, or a model's dictionaries)
    backprops = []
    longest_first = sorted(units, key=len, reverse=True)
    # a batch's padded size (rows x (longest + 2)) stays within batch_tokens
    for batch in batches_by_padded_tokens(longest_first, settings.batch_tokens):
        char_ids = model.ops.asarray(bilm_ids.batch_to_ids([unit.words for unit in batch]).numpy())
        if fine_tune:
            layers, backprop_batch = layer.begin_update(char_ids)
            backprops.append((batch, backprop_batch, layers.shape))
        else:
            layers = layer.predict(char_ids)  # (L + 1, rows, time, 2P), no autograd
        for row, unit in enumerate(batch):
            # (L + 1, n, 2P)
            values = layers[:, row, : len(unit.words)].astype(settings.store_dtype)
            outputs[unit.doc][:, unit.positions] = values
            if cache is not None:
                cache.put(unit.words, values)
    return backprops


# ---------------------------------------------------------------------- the biLM's units
@dataclass
class Unit:
    """One biLM input sequence: token positions of one doc and their texts."""

    doc: int
    positions: Sequence[int]
    words: Tuple[str, ...]

    def __len__(self) -> int:
        return len(self.words)


def doc_units(
    doc: Doc,
    index: int,
    max_tokens: int,
    split_sentences: bool = False,
    sentence_punct: Optional[Sequence[str]] = None,
) -> List[Unit]:
    """The biLM inputs of one doc: sentences (or the doc) in windows, whitespace dropped."""
    if not len(doc):
        return []
    # One pass over the doc's arrays instead of a Token object per token (twice, with the
    # sentencizer): a sizeable part of the elmo component's time on short docs.
    orths, punct, space = doc.to_array([ORTH, IS_PUNCT, IS_SPACE]).T.tolist()
    strings = doc.vocab.strings
    if doc.has_annotation("SENT_START"):
        starts = [span.start for span in doc.sents]
    elif split_sentences:
        starts = rule_sentence_starts([strings[o] for o in orths], punct, sentence_punct)
    else:
        starts = [0]
    units = []
    for start, end in zip(starts, starts[1:] + [len(doc)]):
        positions = [i for i in range(start, end) if not space[i]]
        for first in range(0, len(positions), max_tokens):
            window = positions[first : first + max_tokens]
            units.append(Unit(index, window, tuple(strings[orths[i]] for i in window)))
    return units


def rule_sentence_starts(
    texts: Sequence[str], is_punct: Sequence[int], punct_chars: Optional[Sequence[str]] = None
) -> List[int]:
    """Where spaCy's rule-based `Sentencizer.predict` starts sentences, from the tokens' texts
    and IS_PUNCT flags: after a token in `punct_chars` and the punctuation that follows it."""
    chars = _punct_set(tuple(punct_chars) if punct_chars else None)  # [] too: the defaults
    starts, seen_period = [0], False
    for i, (text, punct) in enumerate(zip(texts, is_punct)):
        in_chars = text in chars
        if seen_period and not punct and not in_chars:
            starts.append(i)
            seen_period = False
        elif in_chars:
            seen_period = True
    return starts


@lru_cache(maxsize=16)
def _punct_set(punct_chars: Optional[Tuple[str, ...]]) -> frozenset:
    """The sentence-final characters, as `Sentencizer(punct_chars=...)` takes them."""
    return frozenset(punct_chars or Sentencizer.default_punct_chars)
