"""The Doc/Span/Token extensions the `elmo` component fills, and how they are read.

What each extension holds is listed in `pipeline.py`. Only `doc._.elmo_layers` and
`doc._.elmo_mix_coefficients` are stored (on the doc, so that a saved doc needs no pipeline);
every other extension is a view or a mix of them, computed when read.
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
    if not Doc.has_extension("elmo_layers"):
        Doc.set_extension("elmo_layers", default=None)
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
