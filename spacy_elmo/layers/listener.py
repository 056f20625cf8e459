"""The listener: a downstream component's view of the `elmo` component's outputs.

In training it receives the layers the `elmo` component computed for the batch (spaCy's
Tok2Vec listener protocol, with the batch id = sum of token orths); at inference, or when
the upstream is frozen and annotating, it reads `doc._.elmo_layers`.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Tuple

from spacy.tokens import Doc
from thinc.api import Model
from thinc.types import Floats3d


class ElmoListener(Model):
    """Outputs one (L + 1, n_tokens, width) array per doc, from the upstream `elmo`."""

    name = "elmo-listener"

    def __init__(self, upstream_name: str, width: int, n_layers: int) -> None:
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

    @classmethod
    def get_batch_id(cls, docs: List[Doc]) -> int:
        return sum(sum(token.orth for token in doc) for doc in docs)

    def receive(self, batch_id: int, outputs: List[Floats3d], backprop: Callable) -> None:
        """Store the upstream's outputs (and how to backprop into it) for the next forward."""
        self._batch_id = batch_id
        self._outputs = outputs
        self._backprop = backprop
        self.attrs["initializing"] = False

    def verify_inputs(self, docs: List[Doc]) -> bool:
        if self._batch_id is None and self._outputs is None:
            raise ValueError(
                "the elmo listener got no outputs from its upstream component: add the "
                f"'{self.upstream_name}' component before this one, or list it in "
                "[training] annotating_components when it is frozen"
            )
        batch_id = self.get_batch_id(docs)
        if batch_id != self._batch_id:
            raise ValueError(
                f"elmo listener: mismatched batch ids ({batch_id} != {self._batch_id}); the "
                "upstream component was updated on a different batch"
            )
        return True


def listener_init(model: ElmoListener, X=None, Y=None) -> None:
    """Dims are fixed by the config; the sample docs of `initialize` have no layers yet."""
    model.attrs["initializing"] = True


def listener_forward(
    model: ElmoListener, docs: List[Doc], is_train: bool
) -> Tuple[List[Floats3d], Callable]:
    if is_train and model._batch_id is not None:
        model.verify_inputs(docs)
        outputs, upstream_backprop = model._outputs, model._backprop

        def backprop(d_outputs: List[Floats3d]) -> List[Doc]:
            model._batch_id = model._outputs = model._backprop = None
            upstream_backprop(d_outputs)
            return []

        return outputs, backprop
    if model.attrs["initializing"] and not is_train and not _have_layers(docs):
        # During `initialize`, thinc passes the sample docs (not yet annotated) through the
        # layers to infer the dims of the next ones: zeros of the right shape do that.
        n_layers, width = model.get_dim("n_layers"), model.get_dim("nO")
        return [model.ops.alloc3f(n_layers, len(doc), width) for doc in docs], lambda d: []
    model.attrs["initializing"] = False
    return [read_layers(model, doc) for doc in docs], lambda d_outputs: []


def _have_layers(docs: List[Doc]) -> bool:
    return Doc.has_extension("elmo_layers") and all(d._.elmo_layers is not None for d in docs)


def read_layers(model: ElmoListener, doc: Doc) -> Floats3d:
    """`doc._.elmo_layers` as a model.ops array, checked against the listener's dims."""
    layers = doc._.elmo_layers if Doc.has_extension("elmo_layers") else None
    if layers is None:
        raise ValueError(
            f"doc._.elmo_layers is not set on a doc of {len(doc)} tokens: run the "
            f"'{model.upstream_name}' component (enabled, before this one) first"
        )
    expected = (model.get_dim("n_layers"), len(doc), model.get_dim("nO"))
    if tuple(layers.shape) != expected:
        raise ValueError(
            f"doc._.elmo_layers has shape {tuple(layers.shape)} but this listener expects "
            f"{expected} (n_layers, tokens, width); check the listener's width and n_layers"
        )
    return model.ops.asarray(layers)
