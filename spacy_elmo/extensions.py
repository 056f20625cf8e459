"""The Doc/Span/Token extensions the `elmo` component fills, and how they are read.

What each extension holds is listed in `pipeline.py`. Only `doc._.elmo_layers` and
`doc._.elmo_mix_coefficients` are stored (on the doc, so that a saved doc needs no pipeline),
and `doc._.elmo_vector_layer` when the component sets vector hooks (`vector_hooks.py`); every
other extension is a view or a mix of them, computed when read. `doc._.elmo_layers` is checked
when set: a (L + 1, len(doc), D) float32 or float16 array, L + 1 the number of mix
coefficients when the doc has them.
"""

from typing import Any

import srsly
from spacy.tokens import Doc, Span, Token
from thinc.api import get_array_module
from thinc.types import Floats3d


def mix_layers(layers: Floats3d, coefficients) -> Any:
    """(L + 1, n, D) layers -> their (n, D) float32 mix sum_j c_j h_j."""
    xp = get_array_module(layers)
    return xp.tensordot(xp.asarray(coefficients, dtype="float32"), layers.astype("float32"), axes=1)


# Where spaCy keeps a doc extension's value (Underscore's key), so that `Doc.to_bytes` and
# `DocBin(store_user_data=True)` keep the layers as they keep any extension value.
_LAYERS_KEY = ("._.", "elmo_layers", None, None)
_LAYER_DTYPES = ("float32", "float16")


def _get_layers(doc: Doc):
    return doc.user_data.get(_LAYERS_KEY)


def _set_layers(doc: Doc, layers) -> None:
    """Store `layers` after checking them against the doc: (n_layers, len(doc), D), float32 or
    float16, n_layers = the doc's number of mix coefficients when it has them."""
    if layers is not None:
        check_layers(doc, layers)
    doc.user_data[_LAYERS_KEY] = layers


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
    layers = span.doc._.elmo_layers
    return None if layers is None else layers[:, span.start : span.end]


def _span_mix(span: Span):
    layers = _span_layers(span)
    return None if layers is None else mix_layers(layers, span.doc._.elmo_mix_coefficients)


def _token_layers(token: Token):
    layers = token.doc._.elmo_layers
    return None if layers is None else layers[:, token.i]


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
