"""Every registered architecture of spacy-elmo (versioned; never change a released version),
and `record_architecture`, which fills the config values left null from the loaded biLM."""

import functools
import inspect
from dataclasses import replace
from typing import Any, Callable, Dict, Iterable, List, Optional

from spacy.tokens import Doc
from spacy.util import registry
from thinc.api import Maxout, Model, chain, concatenate, with_array
from thinc.types import Floats2d, Floats3d

from ..bilm import BiLM
from ..bilm.cache import BoundedCache
from ..layers.bilm_wrapper import PendingBiLM, bilm_layer
from ..layers.elmo_model import (
    ARCHITECTURE_KEYS,
    RunSettings,
    architecture_of,
    ensure_weights,
    get_bilm,
    options_from_architecture,
)
from ..layers.elmo_model import forward as elmo_forward
from ..layers.listener import ElmoLayersListener
from ..layers.scalar_mix import scalar_mix

MODEL = "spacy_elmo.ElmoModel.v1"
LISTENER = "spacy_elmo.ElmoListener.v1"
TOK2VEC = "spacy_elmo.ElmoTok2Vec.v1"
MIX = "spacy_elmo.ElmoMix.v1"
STORE_DTYPES = ("float32", "float16")


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
    cache_mb: Optional[float] = None,
) -> Model[List[Doc], List[Floats3d]]:
    """The biLM (dims as in options.json) over doc sentences, one (L+1, n, 2P) array per doc.

    Architecture values left null (char_embedding_dim ... use_skip_connections) are taken
    from the weights when the pipeline is initialized and written into the pipeline's config;
    given values are checked against the weights. A clip of 0 means no clipping. Weights are
    not part of the architecture: they come from `[initialize.components.elmo]`, from the
    pipeline directory, or, when none were given, the bundled English biLM.

    cache_mb: bound the training cache of frozen layers in megabytes too (null: tokens only).
    How docs are cut into sentences (`split_sentences`, `sentence_punct`) is a setting of the
    model's holder: the `elmo` component, or the `spacy_elmo.ElmoMix.v1` replacing a listener.
    """
    if store_dtype not in STORE_DTYPES:
        raise ValueError(f"store_dtype must be one of {STORE_DTYPES}, got {store_dtype!r}")
    if max_tokens < 1 or batch_tokens < max_tokens + 2:
        raise ValueError(
            f"need max_tokens >= 1 and batch_tokens >= max_tokens + 2, got max_tokens="
            f"{max_tokens}, batch_tokens={batch_tokens}"
        )
    if cache_tokens < 0:
        raise ValueError(f"cache_tokens must be non-negative, got {cache_tokens}")
    if cache_mb is not None and cache_mb < 0:
        raise ValueError(f"cache_mb must be non-negative or null, got {cache_mb}")
    if filters is not None:  # lists of ints, compared with `architecture_of` of the weights
        filters = [list(map(int, f)) for f in filters]
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
    configured = {key: value for key, value in architecture.items() if value is not None}
    if len(configured) == len(ARCHITECTURE_KEYS):
        bilm = BiLM(options_from_architecture(configured, source="[components.elmo.model]"))
    else:  # the architecture comes from the weights (`set_weights`)
        bilm = PendingBiLM()
    max_bytes = None if cache_mb is None else int(cache_mb * 2**20)
    return Model(
        "elmo",
        elmo_forward,
        init=ensure_weights,
        layers=[bilm_layer(bilm)],
        # the dims that the config gives are known already
        dims={
            "nO": None if projection_dim is None else 2 * projection_dim,
            "n_layers": None if n_layers is None else n_layers + 1,
        },
        attrs={
            "architecture": configured,  # what the config gave; the rest comes from the weights
            "settings": RunSettings(max_tokens, batch_tokens, frozen, grad_factor, store_dtype),
            "weights_loaded": False,
            # a training unit's words -> its layers; the size of an entry is its tokens
            "cache": BoundedCache(cache_tokens if frozen else 0, max_bytes),
            "replace_listener": _replace_listener,
        },
    )


def set_unit_rule(model: Model, *, split_sentences: bool, sentence_punct: Optional[List[str]]):
    """Set how `model` (an ElmoModel.v1) cuts docs without sentence boundaries (`RunSettings`),
    and the rule an inline ElmoMix.v1 replacing a listener of it copies."""
    if sentence_punct is not None and (
        isinstance(sentence_punct, str) or not all(isinstance(p, str) and p for p in sentence_punct)
    ):
        raise TypeError(
            f"sentence_punct must be null or a list of non-empty strings, got {sentence_punct!r}"
        )
    punct = None if sentence_punct is None else tuple(sentence_punct)
    model.attrs["settings"] = replace(
        model.attrs["settings"], split_sentences=split_sentences, sentence_punct=punct
    )
    model.attrs["replace_listener_cfg"] = functools.partial(
        _replace_listener_cfg, split_sentences=split_sentences, sentence_punct=sentence_punct
    )


# scalar_mix's keyword arguments: the mix settings of a listener and of an inline ElmoMix.
_MIX_PARAMETERS = tuple(
    parameter
    for parameter in inspect.signature(scalar_mix).parameters.values()
    if parameter.kind is parameter.KEYWORD_ONLY
)
# What a listener's config and the inline ElmoMix replacing it share.
MIX_KEYS = ("n_layers", *(parameter.name for parameter in _MIX_PARAMETERS))


def takes_mix_arguments(architecture: Callable[..., Model]) -> Callable[..., Model]:
    """Give `architecture`, which takes `**mix`, scalar_mix's keyword arguments (layer_norm
    ... trainable, with their types and defaults) in its signature, so that configs are
    filled and checked against them and the docs list them; they are written once, in
    `scalar_mix`."""
    signature = inspect.signature(architecture)
    own = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    architecture.__signature__ = signature.replace(parameters=own + list(_MIX_PARAMETERS))
    return architecture


@registry.architectures(LISTENER)
@takes_mix_arguments
def ElmoListener(
    width: Optional[int] = None,
    n_layers: Optional[int] = None,
    upstream: str = "*",
    **mix: Any,
) -> Model[List[Doc], List[Floats2d]]:
    """This component's own mix gamma * sum_j s_j h_j of the upstream `elmo` layers.

    An `ElmoLayersListener` (the upstream's (L + 1, n, width) layers) chained with a
    `spacy_elmo.ScalarMix.v1` of the other arguments. width is 2P of the biLM (256 for the
    bundled model), n_layers is L + 1; null takes them from the upstream component when the
    pipeline is initialized.
    """
    listener = ElmoLayersListener(upstream, width=width, n_layers=n_layers)
    return _with_mix(listener, width, n_layers, mix)


@registry.architectures(MIX)
@takes_mix_arguments
def ElmoMix(
    elmo: Model[List[Doc], List[Floats3d]],
    n_layers: Optional[int] = None,
    split_sentences: bool = True,
    sentence_punct: Optional[List[str]] = None,
    **mix: Any,
) -> Model[List[Doc], List[Floats2d]]:
    """An inline biLM with its mix: what `nlp.replace_listeners` puts in a listener's place.

    split_sentences, sentence_punct: the sentence rule of the inline biLM, the `elmo`
    component's (copied by `nlp.replace_listeners`)."""
    set_unit_rule(elmo, split_sentences=split_sentences, sentence_punct=sentence_punct)
    return _with_mix(elmo, elmo.maybe_get_dim("nO"), n_layers, mix)


def _with_mix(
    layers: Model, width: Optional[int], n_layers: Optional[int], mix: Dict[str, Any]
) -> Model[List[Doc], List[Floats2d]]:
    """Docs -> (L + 1, n, width) layers -> this component's mixed (n, width) vectors.

    A width of None is inferred when the model is initialized (after the upstream's).
    """
    model = chain(layers, scalar_mix(n_layers, **mix))
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


def _replace_listener(model: Model) -> Model:
    """Called by `nlp.replace_listeners` on the copy of the elmo model: give it its own cache."""
    model.attrs["cache"] = model.attrs["cache"].empty_copy()
    return model


def _replace_listener_cfg(
    elmo_cfg: Dict[str, Any],
    tok2vec_cfg: Dict[str, Any],
    *,
    split_sentences: bool,
    sentence_punct: Optional[List[str]],
) -> Dict:
    """The config of an inline ElmoMix.v1 that keeps the listener's own mix settings and the
    `elmo` component's sentence rule."""
    listener_cfg = tok2vec_cfg
    if tok2vec_cfg.get("@architectures") == TOK2VEC:  # the listener is its elmo
        listener_cfg = tok2vec_cfg["elmo"]
    if listener_cfg.get("@architectures") != LISTENER:
        raise ValueError(
            f"replace_listeners: expected a {LISTENER} config, got "
            f"{listener_cfg.get('@architectures')!r}"
        )
    mix = {key: listener_cfg[key] for key in MIX_KEYS if key in listener_cfg}
    units = {"split_sentences": split_sentences, "sentence_punct": sentence_punct}
    return {"@architectures": MIX, "elmo": elmo_cfg, **units, **mix}


def record_architecture(nlp, name: str, model: Model, listening: List[str]) -> None:
    """Write the biLM's architecture (`model`, the `elmo` component `name`'s) and the dims of
    its listeners in the `listening` components into the config values left null, so that
    the saved pipeline builds the same model without the weights files."""
    config = nlp.get_pipe_config(name)["model"]
    if config.get("@architectures") == MODEL:
        filled = architecture_of(get_bilm(model).options)
        config.update({key: value for key, value in filled.items() if config.get(key) is None})
    dims = {"width": model.get_dim("nO"), "n_layers": model.get_dim("n_layers")}
    for component in listening:
        if component in nlp.component_names:
            for block in _listener_configs(nlp.get_pipe_config(component), name):
                block.update({key: dim for key, dim in dims.items() if block.get(key) is None})


def _listener_configs(config: Any, upstream: str) -> Iterable[Dict[str, Any]]:
    """The ElmoListener.v1 blocks in a component's config that listen to `upstream`."""
    if isinstance(config, dict):
        listens = config.get("upstream", "*") in ("*", upstream)
        if config.get("@architectures") == LISTENER and listens:
            yield config
        for value in config.values():
            yield from _listener_configs(value, upstream)
