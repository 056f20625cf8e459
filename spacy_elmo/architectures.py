"""Every registered architecture of spacy-elmo (versioned; never change a released version)."""

import inspect
from typing import Any, Callable, Dict, List, Optional

from spacy.tokens import Doc
from spacy.util import registry
from thinc.api import Maxout, Model, chain, concatenate, with_array
from thinc.types import Floats2d, Floats3d

from .layers.elmo_model import elmo_model
from .layers.listener import ElmoListener
from .layers.scalar_mix import SCALAR_MIX, scalar_mix
from .loaders import bundled_bilm

MODEL = "spacy_elmo.ElmoModel.v1"
LISTENER = "spacy_elmo.ElmoListener.v1"
TOK2VEC = "spacy_elmo.ElmoTok2Vec.v1"
MIX = "spacy_elmo.ElmoMix.v1"


def architecture_defaults(function: Callable[..., Any]) -> Dict[str, Any]:
    """The default of every argument of a registered function, as a config section."""
    return {
        name: parameter.default
        for name, parameter in inspect.signature(function).parameters.items()
        if parameter.default is not inspect.Parameter.empty
    }


@registry.architectures(MODEL)
def ElmoModel(
    char_embedding_dim: Optional[int] = None,
    filters: Optional[List[List[int]]] = None,
    n_highway: Optional[int] = None,
    activation: Optional[str] = None,
    lstm_dim: Optional[int] = None,
    projection_dim: Optional[int] = None,
    n_layers: Optional[int] = None,
    cell_clip: Optional[float] = None,
    proj_clip: Optional[float] = None,
    use_skip_connections: Optional[bool] = None,
    max_tokens: int = 256,
    batch_tokens: int = 4096,
    frozen: bool = True,
    grad_factor: float = 1.0,
    cache_tokens: int = 1_000_000,
    store_dtype: str = "float32",
    split_sentences: bool = False,
    sentence_punct: Optional[List[str]] = None,
    cache_mb: Optional[float] = None,
) -> Model[List[Doc], List[Floats3d]]:
    """The biLM (dims as in options.json) over doc sentences, one (L+1, n, 2P) array per doc.

    Architecture values left null (char_embedding_dim ... use_skip_connections) are taken
    from the weights when the pipeline is initialized and written into the pipeline's config;
    given values are checked against the weights. A clip of 0 means no clipping. Weights are
    not part of the architecture: they come from `[initialize.components.elmo]`, from the
    pipeline directory, or, when none were given, the bundled English biLM.

    split_sentences: cut docs without sentence boundaries into sentences with spaCy's
    rule-based sentencizer rule (`sentence_punct`, default its punctuation) before the biLM.
    cache_mb: bound the training cache of frozen layers in megabytes too (null: tokens only).
    """
    architecture = {
        "char_embedding_dim": char_embedding_dim,
        "filters": filters,
        "n_highway": n_highway,
        "activation": activation,
        "lstm_dim": lstm_dim,
        "projection_dim": projection_dim,
        "n_layers": n_layers,
        "cell_clip": cell_clip,
        "proj_clip": proj_clip,
        "use_skip_connections": use_skip_connections,
    }
    model = elmo_model(
        architecture,
        max_tokens=max_tokens,
        batch_tokens=batch_tokens,
        frozen=frozen,
        grad_factor=grad_factor,
        cache_tokens=cache_tokens,
        cache_mb=cache_mb,
        store_dtype=store_dtype,
        split_sentences=split_sentences,
        sentence_punct=sentence_punct,
    )
    model.attrs["default_weights"] = bundled_bilm
    model.attrs["replace_listener"] = _replace_listener
    model.attrs["replace_listener_cfg"] = _replace_listener_cfg
    return model


@registry.architectures(LISTENER)
def ElmoListenerMix(
    width: Optional[int] = None,
    n_layers: Optional[int] = None,
    upstream: str = "*",
    layer_norm: bool = False,
    layer_dropout: float = 0.0,
    initial_weights: Optional[List[float]] = None,
    gamma: float = 1.0,
    trainable: bool = True,
) -> Model[List[Doc], List[Floats2d]]:
    """This component's own mix gamma * sum_j s_j h_j of the upstream `elmo` layers.

    width is 2P of the biLM (256 for the bundled model), n_layers is L + 1; null takes them
    from the upstream component when the pipeline is initialized.
    """
    listener = ElmoListener(upstream, width=width, n_layers=n_layers)
    settings = dict(layer_norm=layer_norm, layer_dropout=layer_dropout, trainable=trainable)
    return _with_mix(listener, width, n_layers, initial_weights, gamma, settings)


@registry.architectures(MIX)
def ElmoMix(
    elmo: Model[List[Doc], List[Floats3d]],
    n_layers: Optional[int] = None,
    layer_norm: bool = False,
    layer_dropout: float = 0.0,
    initial_weights: Optional[List[float]] = None,
    gamma: float = 1.0,
    trainable: bool = True,
) -> Model[List[Doc], List[Floats2d]]:
    """An inline biLM with its mix: what `nlp.replace_listeners` puts in a listener's place."""
    settings = dict(layer_norm=layer_norm, layer_dropout=layer_dropout, trainable=trainable)
    width = elmo.maybe_get_dim("nO")
    return _with_mix(elmo, width, n_layers, initial_weights, gamma, settings)


# The mix settings that a listener and an inline ElmoMix share (all but ElmoMix's `elmo`).
MIX_KEYS = tuple(name for name in inspect.signature(ElmoMix).parameters if name != "elmo")


def _with_mix(
    layers: Model,
    width: Optional[int],
    n_layers: Optional[int],
    initial_weights: Optional[List[float]],
    gamma: float,
    settings: Dict[str, Any],
) -> Model[List[Doc], List[Floats2d]]:
    """Docs -> (L + 1, n, width) layers -> this component's mixed (n, width) vectors.

    A width of None is inferred when the model is initialized (after the upstream's).
    """
    mix = scalar_mix(n_layers, initial_weights=initial_weights, gamma=gamma, **settings)
    model = chain(layers, mix)
    if width is not None:
        model.set_dim("nO", width)
    return model


@registry.architectures(TOK2VEC)
def ElmoTok2Vec(
    elmo: Model[List[Doc], List[Floats2d]],
    embed: Model[List[Doc], List[Floats2d]],
    encode: Model[Floats2d, Floats2d],
) -> Model[List[Doc], List[Floats2d]]:
    """The paper's [x_k; ELMo_k]: mixed ELMo concatenated with context-free token features.

    The concatenation is projected to the encoder's width (Maxout), then encoded.
    """
    width = encode.get_dim("nO")
    model = chain(
        concatenate(elmo, embed),
        with_array(Maxout(width, nP=3, normalize=True)),
        with_array(encode),
    )
    model.set_dim("nO", width)
    return model


# The scalar mix is a Thinc layer (registry.layers); its name also resolves as an architecture.
registry.architectures(SCALAR_MIX)(scalar_mix)


def _replace_listener(model: Model) -> Model:
    """Called by `nlp.replace_listeners` on the copy of the elmo model: give it its own cache."""
    model.attrs["cache"] = model.attrs["cache"].empty_copy()
    return model


def _replace_listener_cfg(elmo_cfg: Dict[str, Any], tok2vec_cfg: Dict[str, Any]) -> Dict:
    """The config of an inline ElmoMix.v1 that keeps the listener's own mix settings."""
    listener_cfg = tok2vec_cfg
    if tok2vec_cfg.get("@architectures") == TOK2VEC:
        listener_cfg = tok2vec_cfg["elmo"]
    if listener_cfg.get("@architectures") != LISTENER:
        raise ValueError(
            f"replace_listeners: expected a {LISTENER} config, got "
            f"{listener_cfg.get('@architectures')!r}"
        )
    mix = {key: listener_cfg[key] for key in MIX_KEYS if key in listener_cfg}
    return {"@architectures": MIX, "elmo": elmo_cfg, **mix}
