"""The `elmo` pipeline component and the Doc/Span/Token extensions it fills (`extensions.py`).

The extensions (h_j: layer j of the biLM at a token, j = 0 .. L; 2P its width; how they behave:
docs/usage.md):

* `doc._.elmo_layers`: the doc's (L + 1, n_tokens, 2P) layers, which follow retokenising after
  the component; `span._.elmo_layers` and `token._.elmo_layers` are views of it. Set by hand,
  it is checked: a (L + 1, len(doc), 2P) float32 or float16 array.
* `doc._.elmo`, `span._.elmo`, `token._.elmo`: the component's own mix sum_j c_j h_j.
* `doc._.elmo_mix_coefficients`: c = gamma * s, one float per layer, kept on the doc so that a
  saved doc's `doc._.elmo` needs no pipeline.
* `doc._.elmo_vector_layer`: with `vector_hooks = true`, the rule ("top", "average" or "mix")
  of the doc's ELMo `token.vector`, `span.vector`, `doc.vector` and `.similarity`.

The names of a mix: s are the layer weights normalised to sum 1 and gamma a scale. The `elmo`
component's `mix_weights` are its fixed weights before normalising (s = mix_weights / their
sum). A downstream component's mix (`spacy_elmo.ElmoListener.v1`: a `spacy_elmo.ScalarMix.v1`
layer) learns pre-softmax weights w, starting from `initial_weights`: s = softmax(w).
"""

import os
import warnings
from contextlib import nullcontext
from itertools import islice
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional

import numpy
import torch
from spacy.language import Language
from spacy.pipeline import Tok2Vec, TrainablePipe
from spacy.tokens import Doc
from spacy.training import Example, validate_examples, validate_get_examples
from spacy.vocab import Vocab
from thinc.api import Model, Optimizer, set_dropout_rate
from thinc.types import Floats3d

from ..bilm import BiLM
from ..bilm.quantize import check_quantize, set_quantize
from ..layers.elmo_model import ensure_weights, get_bilm, set_weights
from ..layers.listener import ElmoLayersListener, set_listener_dims
from ..layers.scalar_mix import check_one_per_layer
from ..util.threads import bilm_threads, thread_count, torch_threads
from .architectures import MODEL, record_architecture, set_unit_rule
from .extensions import check_vector_layer, install_extensions, mix_layers, set_vector_hooks
from .overlap import overlap_applies, overlapped_pipe


# The factory's defaults are those of its signature, and its model's those of ElmoModel.v1's
# (spaCy fills the config from them).
@Language.factory(
    "elmo",
    default_config={"model": {"@architectures": MODEL}},
    assigns=["doc._.elmo_layers", "doc._.elmo_mix_coefficients"],
)
def make_elmo(
    nlp: Language,
    name: str,
    model: Model[List[Doc], List[Floats3d]],
    mix_weights: Optional[List[float]] = None,
    gamma: float = 1.0,
    set_tensor: bool = False,
    split_sentences: bool = True,
    sentence_punct: Optional[List[str]] = None,
    vector_hooks: bool = False,
    vector_layer: str = "top",
    quantize: Optional[str] = None,
    overlap: bool = True,
    threads: Optional[int] = None,
) -> "Elmo":
    """ELMo layers for every token, and this component's own mix of them, `doc._.elmo` =
    sum_j c_j h_j with c = gamma * s: `mix_weights` are the layer weights before s normalises
    them to sum 1 (non-negative; null: equal), `gamma` the scale. c is stored on every doc as
    `doc._.elmo_mix_coefficients`; `set_tensor` writes the mix into `doc.tensor`.

    split_sentences: a doc without sentence boundaries is read sentence by sentence, cut by
    spaCy's sentencizer rule (`sentence_punct`, null: the sentencizer's); false: as one unit.
    vector_hooks: `.vector` and `.similarity` of tokens, spans and docs use ELMo's
    `vector_layer`: "top" (h_L), "average" (the mean of the layers) or "mix" (`token._.elmo`).
    quantize ("bf16"), overlap (the biLM one batch ahead in `nlp.pipe`) and threads (the biLM's
    torch threads; null: 1 in training, else torch's): speed on the CPU. All: docs/usage.md."""
    return Elmo(
        nlp.vocab,
        model,
        name,
        mix_weights=mix_weights,
        gamma=gamma,
        set_tensor=set_tensor,
        split_sentences=split_sentences,
        sentence_punct=sentence_punct,
        vector_hooks=vector_hooks,
        vector_layer=vector_layer,
        quantize=quantize,
        overlap=overlap,
        threads=threads,
    )


class Elmo(Tok2Vec):
    """Runs the biLM over each doc's sentences and shares its layers with listeners (spaCy's
    `Tok2Vec` protocol: its listener map, with `ElmoLayersListener`s in it)."""

    def __init__(self, vocab: Vocab, model: Model, name: str = "elmo", **cfg: Any) -> None:
        """`cfg`: every setting of the `elmo` factory (`make_elmo`, which builds the component
        and holds the settings' defaults)."""
        install_extensions()
        check_quantize(cfg["quantize"], f"quantize of the '{name}' component")
        thread_count(cfg["threads"], f"threads of the '{name}' component")  # checked, not applied
        vector_layer = cfg["vector_layer"]
        check_vector_layer(vector_layer, f"vector_layer of the '{name}' component")
        if cfg["set_tensor"] and cfg["vector_hooks"] and vector_layer != "mix":
            raise ValueError(
                f"the '{name}' component's set_tensor writes the mix into doc.tensor, where "
                f'vector_hooks keeps its {vector_layer!r} vectors: set vector_layer = "mix" '
                "(the same vectors), or one of set_tensor and vector_hooks to false"
            )
        super().__init__(vocab, model, name)  # the model, and an empty listener map
        self.cfg = cfg
        set_unit_rule(
            model, split_sentences=cfg["split_sentences"], sentence_punct=cfg["sentence_punct"]
        )
        self._thread_counts: Dict[tuple, int] = {}  # `_threads`
        self._coefficients: Dict[tuple, numpy.ndarray] = {}  # `mix_coefficients`
        if model.maybe_get_dim("n_layers") is not None:  # mix_weights checked where it is known
            mix_coefficients(cfg["mix_weights"], cfg["gamma"], model.get_dim("n_layers"))

    # ------------------------------------------------------------------ the biLM
    def _bilm_as_configured(self) -> None:
        """The biLM (the bundled one if no weights were loaded: a pipeline used without
        `initialize`) in the `quantize` setting, read from the config at each call (cheap when
        it holds already): the config is the setting's one store."""
        ensure_weights(self.model)
        bilm, wanted = get_bilm(self.model), self.cfg["quantize"]
        if getattr(bilm, "quantize", None) != (None if wanted == "none" else wanted):
            set_quantize(bilm, wanted)

    def _threads(self, training: bool = False) -> int:
        """The biLM's torch threads: `bilm_threads` of the `threads` setting, worked out again
        (it reads the CPU affinity and cgroup files) only when the setting, torch's own count
        or the process changes."""
        key = (self.cfg["threads"], training, torch.get_num_threads(), os.getpid())
        if key not in self._thread_counts:
            self._thread_counts[key] = bilm_threads(self.cfg["threads"], training=training)
        return self._thread_counts[key]

    @property
    def mix_coefficients(self) -> numpy.ndarray:
        """c = gamma * s of `doc._.elmo`, from the config (known once the biLM's number of
        layers is), worked out again only when the config's values or the biLM change."""
        weights, gamma = self.cfg["mix_weights"], self.cfg["gamma"]
        n_layers = self.model.get_dim("n_layers")
        key = (None if weights is None else tuple(weights), gamma, n_layers)
        if key not in self._coefficients:
            self._coefficients[key] = mix_coefficients(weights, gamma, n_layers)
        return self._coefficients[key]

    # ------------------------------------------------------------------ listeners
    def add_listener(self, listener: ElmoLayersListener, component_name: str) -> None:
        super().add_listener(listener, component_name)
        width, n_layers = self.model.maybe_get_dim("nO"), self.model.maybe_get_dim("n_layers")
        set_listener_dims(listener, width, n_layers)  # None while the biLM is not known
        # spaCy links components again once all are initialized: from then on, docs without
        # layers at inference are worth a warning.
        listener.attrs["initializing"] = False

    def find_listeners(self, component) -> None:
        names = ("*", self.name)
        if isinstance(getattr(component, "model", None), Model):
            for node in component.model.walk():
                if isinstance(node, ElmoLayersListener) and node.upstream_name in names:
                    self.add_listener(node, component.name)

    # ------------------------------------------------------------------ prediction
    def pipe(self, stream: Iterable[Doc], *, batch_size: int = 128) -> Iterator[Doc]:
        """The docs of `stream` with their layers, in batches of `batch_size`: with `overlap`
        (on the CPU), the biLM one batch ahead in a background thread (`overlap.py`)."""
        if overlap_applies(self):
            yield from overlapped_pipe(self, stream, batch_size)
        else:
            yield from super().pipe(stream, batch_size=batch_size)

    def predict(self, docs: Iterable[Doc], *, threads: Optional[int] = None) -> List[Floats3d]:
        """The layers of `docs`, the biLM on `threads` torch threads (default: by the
        `threads` setting, `util.threads.bilm_threads`)."""
        self._bilm_as_configured()
        count = threads or self._threads()
        with nullcontext() if count == torch.get_num_threads() else torch_threads(count):
            return self.model.predict(list(docs))

    def set_annotations(self, docs: Iterable[Doc], layers: List[Floats3d]) -> None:
        coefficients = self.mix_coefficients
        for doc, doc_layers in zip(docs, layers):
            doc._.elmo_mix_coefficients = coefficients.tolist()
            doc._.elmo_layers = doc_layers  # checked against the coefficients and the doc
            if self.cfg["vector_hooks"]:  # their vectors in doc.tensor (with set_tensor: the mix)
                set_vector_hooks(doc, self.cfg["vector_layer"], vectors_as_tensor=True)
            elif self.cfg["set_tensor"]:
                doc.tensor = mix_layers(doc_layers, coefficients)

    # ------------------------------------------------------------------ training
    def update(
        self,
        examples: Iterable[Example],
        *,
        drop: float = 0.0,
        sgd: Optional[Optimizer] = None,
        losses: Optional[Dict[str, float]] = None,
    ) -> Dict[str, float]:
        """Compute the layers of the batch once and hand them to every listener."""
        if losses is None:
            losses = {}
        validate_examples(examples, "Elmo.update")
        docs = [eg.predicted for eg in examples]
        losses.setdefault(self.name, 0.0)
        set_dropout_rate(self.model, drop)
        self._bilm_as_configured()
        threads = self._threads(training=True)
        with torch_threads(threads):
            layers, backprop_layers = self.model.begin_update(docs)
        ops = self.model.ops
        d_layers = [ops.alloc(x.shape, dtype="float32") for x in layers]
        # The loss reported is the squared gradient that reaches a fine-tuned biLM; a frozen
        # one, of which nothing trains, reports 0 (the listeners' mixes are in their own).
        fine_tuned = not self.model.attrs["settings"].frozen

        def accumulate_gradient(one_d_layers: List[Floats3d]) -> List[Floats3d]:
            if fine_tuned:
                for i, d in enumerate(one_d_layers):
                    d_layers[i] += d
                    losses[self.name] += float((d**2).sum())
            return [ops.alloc(x.shape, dtype="float32") for x in layers]

        def backprop(one_d_layers: List[Floats3d]) -> List[Doc]:
            accumulate_gradient(one_d_layers)
            with torch_threads(threads):
                d_docs = backprop_layers(d_layers)
            if sgd is not None:
                self.finish_update(sgd)
            return d_docs

        batch_id = ElmoLayersListener.get_batch_id(docs)
        for listener in self.listeners[:-1]:
            listener.receive(batch_id, layers, accumulate_gradient)
        if self.listeners:
            self.listeners[-1].receive(batch_id, layers, backprop)
        return losses

    def initialize(
        self,
        get_examples: Callable[[], Iterable[Example]],
        *,
        nlp: Optional[Language] = None,
        weights: Optional[Callable[[], BiLM]] = None,
    ) -> None:
        """Load the biLM weights (`weights` loader, else the bundled model); fill the
        architecture values and listener dims the config left null (in `nlp.config` too) and
        check the given ones."""
        validate_get_examples(get_examples, "Elmo.initialize")
        if weights is not None:
            source = getattr(weights, "source", "the weights loader")
            set_weights(self.model, weights(), source)
        doc_sample = [eg.reference for eg in islice(get_examples(), 10)]
        self.model.initialize(X=doc_sample)
        self._fit_listeners()
        # mix_weights checked, now that the biLM's number of layers is known
        mix_coefficients(self.cfg["mix_weights"], self.cfg["gamma"], self.model.get_dim("n_layers"))
        if nlp is None:
            return
        record_architecture(nlp, self.name, self.model, self.listening_components)
        # Training other components without a listener runs the biLM for nothing (with none,
        # this component's layers are the pipeline's product).
        unfed = [
            name
            for name, pipe in nlp.pipeline
            if pipe is not self and isinstance(pipe, TrainablePipe)
        ]
        outputs = self.listeners or self.cfg["set_tensor"] or self.cfg["vector_hooks"]
        if unfed and not outputs:
            warnings.warn(
                f"nothing listens to the '{self.name}' component and set_tensor and vector_hooks "
                "are false: it computes doc._.elmo_layers, but no component uses them (training "
                f"{', '.join(repr(name) for name in unfed)} runs the biLM for nothing). Give "
                f'components a spacy_elmo.ElmoListener.v1 (upstream = "{self.name}"), e.g. with '
                "`spacy-elmo init-config`, or set set_tensor = true to get doc.tensor "
                "(vector_hooks = true: token.vector and .similarity); ignore this if your own "
                "code reads doc._.elmo_layers",
                ElmoUnusedWarning,
                stacklevel=2,
            )

    def _fit_listeners(self) -> None:
        """Give the listeners the biLM's width and layers where they left them open; raise
        where they were given others."""
        width, n_layers = self.model.get_dim("nO"), self.model.get_dim("n_layers")
        for component, listeners in self.listener_map.items():
            for listener in listeners:
                set_listener_dims(listener, width, n_layers)
                got = listener.get_dim("nO"), listener.get_dim("n_layers")
                if got != (width, n_layers):
                    raise ValueError(
                        f"the elmo listener of '{component}' has width={got[0]}, n_layers="
                        f"{got[1]} but the '{self.name}' biLM gives width={width} "
                        f"(2 x projection_dim), n_layers={n_layers}; fix the listener's "
                        "config (or set width and n_layers to null to take them from the biLM)"
                    )

    # The settings stay those of the config this component was built with: spaCy would read
    # the saved `cfg` over them, and `spacy.load(path, config=...)` overrides must hold. Layers
    # cached from the weights before are dropped.
    def from_bytes(self, bytes_data, *, exclude=tuple()):
        result = super().from_bytes(bytes_data, exclude=(*exclude, "cfg"))
        self.model.attrs["cache"].clear()
        return result

    def from_disk(self, path, *, exclude=tuple()):
        try:
            result = super().from_disk(path, exclude=(*exclude, "cfg"))
        except (ValueError, OSError, KeyError, TypeError) as err:
            raise ValueError(
                f"the '{self.name}' component's files in {path} cannot be read ({err}); the "
                f"pipeline directory may be truncated or damaged (its weights are in "
                f"{Path(path) / 'model'})"
            ) from err
        self.model.attrs["cache"].clear()
        return result


def feed_listeners_of(elmo: Elmo, component: str) -> bool:
    """Make `component`'s listeners run `elmo` on their docs when they find no output of it
    (update in training, annotate at inference; for `spacy-elmo debug-model`); False if it
    has no listeners of `elmo`."""

    def feed(docs: List[Doc], is_train: bool) -> None:
        if is_train:
            elmo.update([Example(doc, doc) for doc in docs])
        else:
            elmo.set_annotations(docs, elmo.predict(docs))

    listeners = elmo.listener_map.get(component, [])
    for listener in listeners:
        listener.feed_upstream = feed
    return bool(listeners)


class ElmoUnusedWarning(UserWarning):
    """The elmo component computes layers that no component uses."""


# ---------------------------------------------------------------------- the component's mix
def mix_coefficients(
    mix_weights: Optional[List[float]], gamma: float, n_layers: int
) -> numpy.ndarray:
    """c = gamma * s as a (n_layers,) float32 vector; s = mix_weights normalised to sum 1
    (default equal)."""
    if mix_weights is None:
        mix_weights = [1.0] * n_layers
    check_one_per_layer("mix_weights", mix_weights, n_layers, "the biLM")
    array = numpy.asarray(mix_weights, dtype="float64")
    if (array < 0).any() or array.sum() <= 0:
        raise ValueError(f"mix_weights must be non-negative and not all 0, got {list(mix_weights)}")
    return (gamma * array / array.sum()).astype("float32")
