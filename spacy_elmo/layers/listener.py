"""The listener: a downstream component's view of the `elmo` component's (L + 1, n, width)
layers, which `spacy_elmo.ElmoListener.v1` chains with the component's own scalar mix.

In training it receives the layers the `elmo` component computed for the batch (spaCy's Tok2Vec
listener protocol); at inference, or from a frozen annotating upstream, it reads
`doc._.elmo_layers`. As spaCy's own listeners, a doc without layers at inference gets zeros,
with a warning; in training that is an error. Its dims may wait for the upstream's biLM.
"""

from __future__ import annotations

import warnings
from typing import Callable, List, Optional, Tuple

from spacy.pipeline.tok2vec import Tok2VecListener
from spacy.tokens import Doc
from thinc.api import Model
from thinc.types import Floats3d


class ElmoLayersListener(Model):
    """Outputs one (L + 1, n_tokens, width) array per doc, from the upstream `elmo`."""

    name = "elmo-listener"

    def __init__(self, upstream_name: str, width: Optional[int], n_layers: Optional[int]) -> None:
        Model.__init__(
            self,
            name=self.name,
            forward=listener_forward,
            init=listener_init,
            dims={"nO": width, "n_layers": n_layers},
            attrs={"initializing": False},
        )
        self.upstream_name = upstream_name
        self._batch_id: Optional[int] = None
        self._outputs: Optional[List[Floats3d]] = None
        self._backprop: Optional[Callable] = None
        # Called with (docs, is_train) when a pass finds no upstream output (nothing received
        # in training, no doc._.elmo_layers at inference), before failing or using zeros:
        # lets a tool run the upstream first (`spacy-elmo debug-model`). Never saved.
        self.feed_upstream: Optional[Callable[[List[Doc], bool], None]] = None

    get_batch_id = Tok2VecListener.get_batch_id  # spaCy's listeners' id of a batch of docs

    def receive(self, batch_id: int, outputs: List[Floats3d], backprop: Callable) -> None:
        """Store the upstream's outputs (and how to backprop into it) for the next forward."""
        self._batch_id = batch_id
        self._outputs = outputs
        self._backprop = backprop
        self.attrs["initializing"] = False


class ElmoListenerWarning(UserWarning):
    """An elmo listener ran without the layers of its upstream component."""


def listener_init(model: ElmoLayersListener, X=None, Y=None) -> None:
    """Dims come from the config or the upstream; the sample docs have no layers yet."""
    if model.maybe_get_dim("nO") is None or model.maybe_get_dim("n_layers") is None:
        raise ValueError(
            f"the elmo listener (upstream '{model.upstream_name}') has no width yet: it is "
            "taken from the upstream elmo component, which must come before this one in the "
            "pipeline and be initialized first (or set width and n_layers in the config)"
        )
    model.attrs["initializing"] = True


def set_listener_dims(model: Model, width: Optional[int], n_layers: Optional[int]) -> None:
    """Fill a listener's unknown width and n_layers where they are given (known values are
    kept for the check)."""
    for dim, value in (("nO", width), ("n_layers", n_layers)):
        if model.maybe_get_dim(dim) is None:
            model.set_dim(dim, value)


def listener_forward(
    model: ElmoLayersListener, docs: List[Doc], is_train: bool
) -> Tuple[List[Floats3d], Callable]:
    if model.feed_upstream is not None:
        if is_train and model._batch_id is None:
            model.feed_upstream(docs, True)
        elif not is_train and any(_layers_of(doc) is None for doc in docs):
            model.feed_upstream(docs, False)
    if is_train and model._batch_id is not None:
        batch_id = model.get_batch_id(docs)
        if batch_id != model._batch_id:
            raise ValueError(
                f"elmo listener: mismatched batch ids ({batch_id} != {model._batch_id}); the "
                "upstream component was updated on a different batch"
            )
        outputs, upstream_backprop = model._outputs, model._backprop

        def backprop(d_outputs: List[Floats3d]) -> List[Doc]:
            model._batch_id = model._outputs = model._backprop = None
            upstream_backprop(d_outputs)
            return []

        return outputs, backprop
    # At inference, or in training from a frozen upstream that annotates: the docs' layers.
    outputs = []
    for doc in docs:
        layers = _layers_of(doc)
        if layers is not None or is_train:
            outputs.append(read_layers(model, doc, layers))
            model.attrs["initializing"] = False
        else:
            # During `initialize` thinc passes the sample docs (not annotated yet) through the
            # layers to infer the dims of the next ones: zeros of the right shape do that.
            # Elsewhere (the upstream disabled, `spacy debug model`) they keep the model
            # runnable, as spaCy's listeners do; the warning says the output is meaningless.
            if not model.attrs["initializing"]:
                warnings.warn(
                    f"an elmo listener got docs without doc._.elmo_layers at inference and "
                    f"uses zeros: the '{model.upstream_name}' component did not run before "
                    "it (disabled, removed or after it in the pipeline)",
                    ElmoListenerWarning,
                    stacklevel=2,
                )
            n_layers, width = model.get_dim("n_layers"), model.get_dim("nO")
            outputs.append(model.ops.alloc3f(n_layers, len(doc), width))
    return outputs, lambda d_outputs: []


def _layers_of(doc: Doc) -> Optional[Floats3d]:
    return doc._.elmo_layers if Doc.has_extension("elmo_layers") else None


def read_layers(model: ElmoLayersListener, doc: Doc, layers: Optional[Floats3d]) -> Floats3d:
    """A doc's `layers` (its `doc._.elmo_layers`) as a model.ops array, checked against the
    listener's dims."""
    if layers is None:
        raise ValueError(
            f"doc._.elmo_layers is not set on a doc of {len(doc)} tokens: run the "
            f"'{model.upstream_name}' component (enabled, before this one) first. (`spacy debug "
            "model` updates a component without the components it listens to: run `spacy-elmo "
            "debug-model CONFIG COMPONENT` instead, which runs them first)"
        )
    expected = (model.get_dim("n_layers"), len(doc), model.get_dim("nO"))
    if tuple(layers.shape) != expected:
        raise ValueError(
            f"doc._.elmo_layers has shape {tuple(layers.shape)} but this listener expects "
            f"{expected} (n_layers, tokens, width); check the listener's width and n_layers"
        )
    return model.ops.asarray(layers)
