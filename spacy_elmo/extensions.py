"""The Doc/Span/Token extensions the `elmo` component fills, and how they are read.

What each extension holds is listed in `pipeline.py`. Only `doc._.elmo_layers` and
`doc._.elmo_mix_coefficients` are stored (on the doc, so that a saved doc needs no pipeline),
and `doc._.elmo_vector_layer` when the component sets vector hooks (`vector_hooks.py`); every
other extension is a view or a mix of them, computed when read. `doc._.elmo_layers` is checked
when set: a (L + 1, len(doc), D) float32 or float16 array, L + 1 the number of mix
coefficients when the doc has them.

Retokenising: with the layers, the character offsets of the tokens they were computed for are
stored. Every read compares them with the doc's tokens now; after `doc.retokenize()`
(`merge_entities`, `merge_noun_chunks`, splits) a token's layers are the mean of the layers of
the tokens it overlaps (whitespace tokens, whose layers are 0, left out unless there is
nothing else): a merged token gets the mean of its parts, each piece of a split token the
original token's layers. The stored layers are never changed by a read, so a merge undone by
a split gives the original layers back.
"""

from typing import Any, Optional

import numpy
import srsly
from spacy.attrs import IDX, LENGTH
from spacy.tokens import Doc, Span, Token
from thinc.api import get_array_module
from thinc.types import Floats3d


def mix_layers(layers: Floats3d, coefficients) -> Any:
    """(L + 1, n, D) layers -> their (n, D) float32 mix sum_j c_j h_j."""
    xp = get_array_module(layers)
    return xp.tensordot(xp.asarray(coefficients, dtype="float32"), layers.astype("float32"), axes=1)


# Where spaCy keeps a doc extension's value (Underscore's key), so that `Doc.to_bytes` and
# `DocBin(store_user_data=True)` keep the layers as they keep any extension value; beside them,
# the (n, 2) character offsets (start, end) of the n tokens they were computed for.
_LAYERS_KEY = ("._.", "elmo_layers", None, None)
_OFFSETS_KEY = ("._.", "elmo_token_offsets", None, None)
VECTOR_LAYER_KEY = ("._.", "elmo_vector_layer", None, None)
_LAYER_DTYPES = ("float32", "float16")


def _get_layers(doc: Doc):
    return layers_of_tokens(doc, 0, len(doc))


def _set_layers(doc: Doc, layers) -> None:
    """Store `layers` after checking them against the doc: (n_layers, len(doc), D), float32 or
    float16, n_layers = the doc's number of mix coefficients when it has them; and the
    character offsets of the doc's tokens, which later reads follow."""
    if layers is None:
        doc.user_data.pop(_OFFSETS_KEY, None)
    else:
        check_layers(doc, layers)
        doc.user_data[_OFFSETS_KEY] = token_offsets(doc)
    doc.user_data[_LAYERS_KEY] = layers


def has_layers(doc: Doc) -> bool:
    """Whether `doc` holds ELMo layers (without reading them)."""
    return doc.user_data.get(_LAYERS_KEY) is not None


def token_offsets(doc: Doc) -> numpy.ndarray:
    """(len(doc), 2) int64: each token's first character and the one after its last."""
    offsets = doc.to_array([IDX, LENGTH]).astype("int64").reshape((len(doc), 2))
    offsets[:, 1] += offsets[:, 0]
    return offsets


def layers_of_tokens(doc: Doc, start: int, end: int) -> Optional[Any]:
    """The (L + 1, end - start, D) layers of the doc's tokens start .. end - 1 as they are now:
    a view of the stored layers, or, after a retokenisation, each token's mean of the layers
    of the tokens it overlaps (module docstring). None when the doc has no layers."""
    layers = doc.user_data.get(_LAYERS_KEY)
    if layers is None:
        return None
    if "vector" not in doc.user_token_hooks and doc.user_data.get(VECTOR_LAYER_KEY) is not None:
        # a doc read from bytes, which lost its ELMo vector hooks: put them back
        from .vector_hooks import set_vector_hooks  # (vector_hooks imports this module)

        set_vector_hooks(doc)
    offsets = doc.user_data.get(_OFFSETS_KEY)
    if offsets is None:  # a doc saved before offsets were kept: its length is all we know
        if layers.shape[1] != len(doc):
            raise ValueError(
                f"doc._.elmo_layers holds {layers.shape[1]} tokens but the doc has {len(doc)} "
                "(it was retokenised after the elmo component) and records no token offsets "
                "to follow the change: run the elmo component after retokenising"
            )
        return _rows(layers, start, end)
    offsets = numpy.asarray(offsets, dtype="int64")
    if offsets.shape != (layers.shape[1], 2):
        raise ValueError(
            f"doc._.elmo_layers holds {layers.shape[1]} tokens but its recorded token offsets "
            f"have shape {offsets.shape}: the doc's user_data was changed by hand; set "
            "doc._.elmo_layers again"
        )
    # The text never changes, so tokens that start where the layers' tokens start are them.
    if len(doc) == len(offsets) and (doc.to_array(IDX) == offsets[:, 0]).all():
        return _rows(layers, start, end)
    return _realign(doc, layers, offsets, token_offsets(doc)[start:end])


def _rows(layers, start: int, end: int):
    """Tokens start .. end - 1 of the stored layers: the array itself for all, else a view."""
    return layers if (start, end) == (0, layers.shape[1]) else layers[:, start:end]


def _realign(doc: Doc, layers, offsets: numpy.ndarray, targets: numpy.ndarray):
    """(L + 1, len(targets), D): for each target (start, end), the mean of the layers of the
    tokens at `offsets` that it overlaps, whitespace tokens left out unless all are."""
    text = doc.text
    if len(offsets) and offsets[-1, 1] > len(text):
        raise ValueError(
            f"doc._.elmo_layers were computed for tokens up to character {offsets[-1, 1]} but "
            f"the doc's text has {len(text)} characters: they belong to another doc"
        )
    first = numpy.searchsorted(offsets[:, 1], targets[:, 0], side="right")
    stop = numpy.searchsorted(offsets[:, 0], targets[:, 1], side="left")
    xp = get_array_module(layers)
    aligned = xp.empty((layers.shape[0], len(targets), layers.shape[2]), dtype=layers.dtype)
    for row, ((char_start, char_end), lo, hi) in enumerate(zip(targets, first, stop)):
        if hi <= lo:
            raise ValueError(
                f"the token {text[char_start:char_end]!r} (characters {char_start}..{char_end}) "
                "overlaps none of the tokens doc._.elmo_layers were computed for"
            )
        parts = [k for k in range(lo, hi) if not text[offsets[k, 0] : offsets[k, 1]].isspace()]
        parts = parts or list(range(lo, hi))
        aligned[:, row] = layers[:, parts].astype("float32").mean(axis=1)  # (L + 1, D)
    return aligned


def check_layers(doc: Doc, layers) -> None:
    """Raise if `layers` cannot be `doc._.elmo_layers`, naming the expected and given shapes."""
    coefficients = doc._.elmo_mix_coefficients
    n_layers = "n_layers" if coefficients is None else len(coefficients)
    expected = f"({n_layers}, {len(doc)}, D)"
    shape = getattr(layers, "shape", None)
    if shape is None or not hasattr(layers, "dtype") or not hasattr(layers, "astype"):
        raise TypeError(
            f"doc._.elmo_layers must be a numpy or cupy array of shape {expected}, got "
            f"{type(layers).__name__}"
        )
    shape = tuple(shape)
    wrong_layers = coefficients is not None and shape[:1] != (n_layers,)
    if len(shape) != 3 or shape[1] != len(doc) or wrong_layers:
        raise ValueError(
            f"doc._.elmo_layers must have shape {expected} (layers, the doc's {len(doc)} "
            f"tokens, width), got {shape}"
            + ("" if coefficients is None else f"; the doc has {n_layers} mix coefficients")
        )
    if str(layers.dtype) not in _LAYER_DTYPES:
        raise TypeError(
            f"doc._.elmo_layers must be float32 or float16, got {layers.dtype} (convert "
            "with .astype('float32'))"
        )


def _doc_mix(doc: Doc):
    layers = doc._.elmo_layers
    return None if layers is None else mix_layers(layers, doc._.elmo_mix_coefficients)


def _span_layers(span: Span):
    return layers_of_tokens(span.doc, span.start, span.end)


def _span_mix(span: Span):
    layers = _span_layers(span)
    return None if layers is None else mix_layers(layers, span.doc._.elmo_mix_coefficients)


def _token_layers(token: Token):
    layers = layers_of_tokens(token.doc, token.i, token.i + 1)
    return None if layers is None else layers[:, 0]


def _token_mix(token: Token):
    layers = _token_layers(token)
    if layers is None:
        return None
    xp = get_array_module(layers)
    coefficients = xp.asarray(token.doc._.elmo_mix_coefficients, dtype="float32")
    return coefficients @ layers.astype("float32")


def install_extensions() -> None:
    """Register the extensions once (idempotent, also in worker processes)."""
    if not Doc.has_extension("elmo_vector_layer"):
        Doc.set_extension("elmo_vector_layer", default=None)
    if not Doc.has_extension("elmo_layers"):
        Doc.set_extension("elmo_layers", getter=_get_layers, setter=_set_layers)
        Doc.set_extension("elmo_mix_coefficients", default=None)
        Doc.set_extension("elmo", getter=_doc_mix)
        Span.set_extension("elmo_layers", getter=_span_layers)
        Span.set_extension("elmo", getter=_span_mix)
        Token.set_extension("elmo_layers", getter=_token_layers)
        Token.set_extension("elmo", getter=_token_mix)


@srsly.msgpack_encoders("spacy_elmo_cupy")
def _encode_cupy(obj, chain=None):
    """GPU arrays on docs are written as numpy arrays (Doc.to_bytes, DocBin, n_process)."""
    if type(obj).__module__.startswith("cupy"):
        obj = obj.get()
    return obj if chain is None else chain(obj)


install_extensions()
