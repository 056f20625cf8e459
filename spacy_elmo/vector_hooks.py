"""ELMo behind spaCy's vectors: `token.vector`, `span.vector`, `doc.vector`, `has_vector`,
`vector_norm` and every `.similarity`, through a doc's user hooks.

The `elmo` component sets them on each doc it annotates when `vector_hooks = true`. A token's
vector is one rule applied to its layers h_0 .. h_L (`token._.elmo_layers`), `vector_layer`:

* "top": h_L, the top biLSTM layer (the most contextual: it tells word senses apart best);
* "average": the mean of h_0 .. h_L;
* "mix": the component's own mix sum_j c_j h_j, i.e. `token._.elmo`.

A span's or doc's vector is the mean of its tokens' vectors, whitespace tokens (which the biLM
does not read: their layers are 0) left out. `.similarity` is the cosine of the two vectors,
for a token, span or doc against a token, span or doc of any doc with ELMo layers (the other
one's vector taken by the same rule); equal word forms get no short-cut, a vector of norm 0
gives 0.0.

Hooks are functions, not data: a pickled doc keeps them, but `Doc.to_bytes`, `DocBin` and
`nlp.pipe(n_process=N)` (which sends docs as bytes) do not (spaCy warns W109). What they need is
kept on the doc (`doc._.elmo_layers`, `doc._.elmo_mix_coefficients` and the rule,
`doc._.elmo_vector_layer`), and the hooks are put back on such a doc (`restore_vector_hooks`)
as it comes back: `Language.pipe` and `DocBin.get_docs` are wrapped to do it on every doc they
yield (`install_hook_restoring`, done on import), and any read of an ELMo extension does it.
A doc read with `Doc.from_bytes` (a compiled method, which cannot be wrapped) gets them at its
first extension read, or from `set_vector_hooks(doc)`.
"""

import functools
from functools import partial
from typing import Any, Callable, Optional, Union

from spacy.language import Language
from spacy.tokens import Doc, DocBin, Span, Token
from thinc.api import get_array_module

from .extensions import (
    VECTOR_LAYER_KEY,
    has_layers,
    install_extensions,
    layers_of_tokens,
    mix_layers,
)

VECTOR_LAYERS = ("top", "average", "mix")


def set_vector_hooks(doc: Doc, vector_layer: Optional[str] = None) -> Doc:
    """Make `doc`'s tokens, spans and itself take their vectors and similarities from ELMo,
    by `vector_layer` (default: the rule recorded on the doc, `doc._.elmo_vector_layer`)."""
    install_extensions()
    if vector_layer is None:
        vector_layer = doc._.elmo_vector_layer
        if vector_layer is None:
            raise ValueError(
                "set_vector_hooks: the doc records no vector_layer (doc._.elmo_vector_layer is "
                f"not set): name one of {', '.join(repr(v) for v in VECTOR_LAYERS)}"
            )
    if vector_layer not in VECTOR_LAYERS:
        raise ValueError(
            f"vector_layer must be one of {', '.join(repr(v) for v in VECTOR_LAYERS)}, "
            f"got {vector_layer!r}"
        )
    if not has_layers(doc):
        raise ValueError(
            "set_vector_hooks: the doc has no ELMo layers (doc._.elmo_layers is None); run it "
            "through a pipeline with the elmo component first"
        )
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
    doc = _doc_of(obj)
    if isinstance(obj, Token):
        start, end = obj.i, obj.i + 1
    else:
        start, end = (obj.start, obj.end) if isinstance(obj, Span) else (0, len(doc))
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
    if not isinstance(other, (Token, Span, Doc)):
        raise TypeError(
            f"ELMo similarity compares a Token, Span or Doc with another, got "
            f"{type(other).__name__}: a word without its sentence has no ELMo vector"
        )
    a = elmo_vector(obj, vector_layer)
    b = elmo_vector(other, vector_layer)
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
    if vector_layer == "mix":
        return mix_layers(layers, coefficients)
    raise ValueError(f"vector_layer must be one of {VECTOR_LAYERS}, got {vector_layer!r}")


def _has_vector(obj: Union[Token, Span, Doc]) -> bool:
    return has_layers(_doc_of(obj))


def _vector_norm(obj: Union[Token, Doc], vector_layer: str) -> float:
    vector = elmo_vector(obj, vector_layer)
    return float(get_array_module(vector).linalg.norm(vector))


def _doc_of(obj: Union[Token, Span, Doc]) -> Doc:
    if isinstance(obj, Doc):
        return obj
    if isinstance(obj, (Token, Span)):
        return obj.doc
    raise TypeError(f"expected a Token, Span or Doc, got {type(obj).__name__}")


def _quote(obj: Any) -> str:
    text = getattr(obj, "text", str(obj))
    return repr(text if len(text) <= 40 else text[:37] + "...")


def restore_vector_hooks(doc: Doc) -> Doc:
    """Put the ELMo hooks back on a doc that records a `vector_layer`, holds ELMo layers and has
    no vector hook (one read from bytes); other docs are left as they are."""
    if (
        "vector" not in doc.user_token_hooks
        and doc.user_data.get(VECTOR_LAYER_KEY) is not None
        and has_layers(doc)
    ):
        set_vector_hooks(doc)
    return doc


# The methods by which docs come back from bytes, wrapped to restore the hooks of each doc.
_RESTORING = ((Language, "pipe"), (DocBin, "get_docs"))


def install_hook_restoring() -> None:
    """Wrap `Language.pipe` (docs from `n_process` workers) and `DocBin.get_docs` so that every
    doc they yield gets its ELMo hooks back (`restore_vector_hooks`); idempotent."""
    for owner, name in _RESTORING:
        method = getattr(owner, name)
        if not getattr(method, "restores_elmo_hooks", False):
            setattr(owner, name, _restoring_hooks(method))


def _restoring_hooks(method: Callable) -> Callable:
    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        for item in method(*args, **kwargs):
            # Language.pipe(as_tuples=True) yields (doc, context)
            restore_vector_hooks(item[0] if isinstance(item, tuple) else item)
            yield item

    wrapper.restores_elmo_hooks = True
    return wrapper


install_hook_restoring()
