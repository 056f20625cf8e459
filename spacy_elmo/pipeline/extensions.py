"""The Doc/Span/Token extensions the `elmo` component fills (listed in `component.py`), and
ELMo behind spaCy's vectors (`vector_hooks`, `set_vector_hooks`).

A doc stores its layers with its tokens' character offsets (`doc.user_data`), the mix
coefficients and the vector rule; every other extension is computed from them when read, and
follows retokenising. The hooks' vectors are in `doc.tensor` too, which spaCy keeps where it
drops hooks (bytes, `n_process`); the hooks come back at a doc's first read of an extension.
"""

from functools import partial
from typing import Any, Optional, Tuple, Union

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


# Where a doc keeps its layers (`doc.user_data`, spaCy's storage for user data, which
# `Doc.to_bytes` and `DocBin(store_user_data=True)` keep), beside the (n, 2) character offsets
# (start, end) of the n tokens they were computed for.
_LAYERS_KEY = "spacy_elmo.layers"
_OFFSETS_KEY = "spacy_elmo.token_offsets"
_LAYER_DTYPES = ("float32", "float16")


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
    if "vector" not in doc.user_token_hooks and doc._.elmo_vector_layer is not None:
        # a doc read from bytes, which lost its ELMo vector hooks: put them back
        set_vector_hooks(doc)
    offsets = numpy.asarray(doc.user_data.get(_OFFSETS_KEY, ()), dtype="int64")
    if offsets.shape != (layers.shape[1], 2):
        raise ValueError(
            f"doc._.elmo_layers holds {layers.shape[1]} tokens but its recorded token offsets "
            f"have shape {offsets.shape}: the doc's user_data was changed by hand; set "
            "doc._.elmo_layers again"
        )
    # The text never changes, so tokens that start where the layers' tokens start are them.
    if len(doc) == len(offsets) and (doc.to_array(IDX) == offsets[:, 0]).all():
        return layers if (start, end) == (0, layers.shape[1]) else layers[:, start:end]
    return _realign(doc, layers, offsets, token_offsets(doc)[start:end])


def _realign(doc: Doc, layers, offsets: numpy.ndarray, targets: numpy.ndarray):
    """(L + 1, len(targets), D): for each target (start, end), the mean of the layers of the
    tokens at `offsets` of its own kind (word or whitespace) that it overlaps; zeros for
    whitespace that overlaps no whitespace token."""
    text = doc.text
    if len(offsets) and offsets[-1, 1] > len(text):
        raise ValueError(
            f"doc._.elmo_layers were computed for tokens up to character {offsets[-1, 1]} but "
            f"the doc's text has {len(text)} characters: they belong to another doc"
        )
    first = numpy.searchsorted(offsets[:, 1], targets[:, 0], side="right")
    stop = numpy.searchsorted(offsets[:, 0], targets[:, 1], side="left")
    xp = get_array_module(layers)
    aligned = xp.zeros((layers.shape[0], len(targets), layers.shape[2]), dtype=layers.dtype)
    for row, ((char_start, char_end), lo, hi) in enumerate(zip(targets, first, stop)):
        space = text[char_start:char_end].isspace()
        parts = [k for k in range(lo, hi) if text[offsets[k, 0] : offsets[k, 1]].isspace() == space]
        if parts:
            aligned[:, row] = layers[:, parts].astype("float32").mean(axis=1)  # (L + 1, D)
        elif not space:  # every character of a word lies in a word of the same text
            raise ValueError(
                f"the token {text[char_start:char_end]!r} (characters {char_start}..{char_end}) "
                "overlaps none of the words doc._.elmo_layers were computed for"
            )
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


def _tokens_of(obj: Union[Token, Span, Doc]) -> Tuple[Doc, int, int]:
    """The doc of a token, span or doc, and the start and end of its tokens."""
    if isinstance(obj, Token):
        return obj.doc, obj.i, obj.i + 1
    if isinstance(obj, Span):
        return obj.doc, obj.start, obj.end
    if isinstance(obj, Doc):
        return obj, 0, len(obj)
    raise TypeError(
        f"ELMo vectors are those of a Token, Span or Doc, got {type(obj).__name__}: a word "
        "without its sentence has no ELMo vector"
    )


def _layers(obj: Union[Token, Span, Doc]):
    """`._.elmo_layers`: (L + 1, n, D) of a doc or span, (L + 1, D) of a token."""
    layers = layers_of_tokens(*_tokens_of(obj))
    return layers[:, 0] if layers is not None and isinstance(obj, Token) else layers


def _mix(obj: Union[Token, Span, Doc]):
    """`._.elmo`: the mix of `._.elmo_layers` by the doc's coefficients."""
    layers = _layers(obj)
    coefficients = _tokens_of(obj)[0]._.elmo_mix_coefficients
    return None if layers is None else mix_layers(layers, coefficients)


def install_extensions() -> None:
    """Register the extensions and the msgpack encoder of GPU arrays, once per process (worker
    processes too); the `elmo` component does it when it is built."""
    if not Doc.has_extension("elmo_layers"):
        Doc.set_extension("elmo_layers", getter=_layers, setter=_set_layers)
        Doc.set_extension("elmo_mix_coefficients", default=None)
        Doc.set_extension("elmo_vector_layer", default=None)
        Doc.set_extension("elmo", getter=_mix)
        for span_or_token in (Span, Token):  # views of the doc's layers and mix
            span_or_token.set_extension("elmo_layers", getter=_layers)
            span_or_token.set_extension("elmo", getter=_mix)
        srsly.msgpack_encoders.register("spacy_elmo_cupy", func=_encode_cupy)


def _encode_cupy(obj, chain=None):
    """GPU arrays on docs are written as numpy arrays (Doc.to_bytes, DocBin, n_process)."""
    if type(obj).__module__.startswith("cupy"):
        obj = obj.get()
    return obj if chain is None else chain(obj)


VECTOR_LAYERS = ("top", "average", "mix")


def check_vector_layer(vector_layer: str, name: str) -> None:
    """ValueError unless `vector_layer` (the setting `name`) is one of VECTOR_LAYERS."""
    if vector_layer not in VECTOR_LAYERS:
        raise ValueError(
            f"{name} must be one of {', '.join(repr(v) for v in VECTOR_LAYERS)}, "
            f"got {vector_layer!r}"
        )


def set_vector_hooks(
    doc: Doc, vector_layer: Optional[str] = None, *, vectors_as_tensor: bool = False
) -> Doc:
    """Make `doc`'s tokens, spans and itself take their vectors and similarities from ELMo,
    by `vector_layer` (default: the rule recorded on the doc, `doc._.elmo_vector_layer`);
    with `vectors_as_tensor`, write the tokens' vectors into `doc.tensor` too (the `elmo`
    component does), which spaCy serves as `token.vector` where the hooks are lost."""
    install_extensions()
    if vector_layer is None:
        vector_layer = doc._.elmo_vector_layer
        if vector_layer is None:
            raise ValueError(
                "set_vector_hooks: the doc records no vector_layer (doc._.elmo_vector_layer is "
                f"not set): name one of {', '.join(repr(v) for v in VECTOR_LAYERS)}"
            )
    check_vector_layer(vector_layer, "vector_layer")
    if not has_layers(doc):
        raise ValueError(
            "set_vector_hooks: the doc has no ELMo layers (doc._.elmo_layers is None); run it "
            "through a pipeline with the elmo component first"
        )
    if vectors_as_tensor:  # the vectors spaCy serves from the doc without the hooks
        layers = layers_of_tokens(doc, 0, len(doc))  # (L + 1, n, D)
        doc.tensor = _layer_rule(layers, vector_layer, doc._.elmo_mix_coefficients)  # (n, D)
    doc._.elmo_vector_layer = vector_layer
    vector = partial(elmo_vector, vector_layer=vector_layer)
    similarity = partial(elmo_similarity, vector_layer=vector_layer)
    norm = partial(_vector_norm, vector_layer=vector_layer)
    hooks = {"vector": vector, "has_vector": _has_vector, "similarity": similarity}
    doc.user_hooks.update(hooks, vector_norm=norm)
    doc.user_token_hooks.update(hooks, vector_norm=norm)
    # No span "vector_norm" hook: spaCy 3's Span.vector_norm calls the span's *vector* hook
    # when one is set; without it, it takes the norm of span.vector, our vector.
    doc.user_span_hooks.update(hooks)
    return doc


def elmo_vector(obj: Union[Token, Span, Doc], vector_layer: str = "top") -> Any:
    """The (D,) float32 ELMo vector of a token, span or doc: `vector_layer` of each token's
    layers, averaged over the tokens of a span or doc (whitespace left out)."""
    doc, start, end = _tokens_of(obj)
    layers = layers_of_tokens(doc, start, end)  # (L + 1, end - start, D), after any retokenising
    if layers is None:
        raise ValueError(
            f"{type(obj).__name__} {_quote(obj)} has no ELMo vector: its doc has no layers "
            "(doc._.elmo_layers is None); run its text through the pipeline with the elmo "
            "component"
        )
    coefficients = doc._.elmo_mix_coefficients
    if isinstance(obj, Token):
        return _layer_rule(layers[:, 0], vector_layer, coefficients)  # (D,)
    positions = [i - start for i in range(start, end) if not doc[i].is_space]
    xp = get_array_module(layers)
    if not positions:
        return xp.zeros((layers.shape[2],), dtype="float32")
    vectors = _layer_rule(layers[:, positions], vector_layer, coefficients)  # (n, D)
    return vectors.mean(axis=0)


def elmo_similarity(
    obj: Union[Token, Span, Doc], other: Union[Token, Span, Doc], vector_layer: str = "top"
) -> float:
    """The cosine of the ELMo vectors of `obj` and `other` (0.0 when one has norm 0)."""
    a = elmo_vector(obj, vector_layer)
    b = elmo_vector(other, vector_layer)  # a Token, Span or Doc too (`_tokens_of`)
    if a.shape != b.shape:
        raise ValueError(
            f"cannot compare {_quote(obj)} with {_quote(other)}: their ELMo vectors have "
            f"widths {a.shape[0]} and {b.shape[0]} (different biLMs)"
        )
    xp = get_array_module(a)
    norms = float(xp.linalg.norm(a)) * float(xp.linalg.norm(b))
    return 0.0 if norms == 0.0 else float(xp.dot(a, b)) / norms


def _layer_rule(layers: Any, vector_layer: str, coefficients: Any) -> Any:
    """(L + 1, ..., D) layers -> (..., D) float32 vectors by `vector_layer`."""
    if vector_layer == "top":
        return layers[-1].astype("float32")
    if vector_layer == "average":
        return layers.astype("float32").mean(axis=0)
    return mix_layers(layers, coefficients)  # "mix"


def _has_vector(obj: Union[Token, Span, Doc]) -> bool:
    return has_layers(_tokens_of(obj)[0])


def _vector_norm(obj: Union[Token, Doc], vector_layer: str) -> float:
    vector = elmo_vector(obj, vector_layer)
    return float(get_array_module(vector).linalg.norm(vector))


def _quote(obj: Any) -> str:
    text = getattr(obj, "text", str(obj))
    return repr(text if len(text) <= 40 else text[:37] + "...")
