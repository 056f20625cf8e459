"""A complete spaCy training config with ELMo for the components a user names.

Every component gets its own ELMo mix through a `spacy_elmo.ElmoListener.v1`, concatenated
with spaCy's context-free token features ([x_k; ELMo_k], Peters et al. 2018) by
`spacy_elmo.ElmoTok2Vec.v1`. The biLM's architecture and the listeners' widths are left null:
they are taken from the weights when the pipeline is initialized. spaCy fills everything else
with its defaults, as `spacy init fill-config` does.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from spacy.util import CONFIG_SECTION_ORDER, load_model_from_config
from thinc.api import Config

from ..weights.sources import PUBLISHED_NAMES, BiLMSource
from .architectures import LISTENER, MODEL, TOK2VEC

# Every component's mix, as in configs/ner_tagger_elmo.cfg: the listener's defaults but for
# these (layer norm: +0.8 NER F1 at 1,000 CoNLL sentences, README "Learning curves").
LISTENER_SETTINGS = {"upstream": "elmo", "layer_norm": True, "layer_dropout": 0.1}
TOK2VEC_WIDTH = 96
ENCODER_DEPTH = 4
GPU_BATCH_TOKENS = 16384  # padded tokens per biLM batch in a `--gpu` config


# The components init-config writes. Each takes the model of its spaCy factory's default config
# with an ELMo tok2vec; the parser with the wider hidden layer of spaCy's accuracy preset.
COMPONENTS = (
    "tagger",
    "morphologizer",
    "trainable_lemmatizer",
    "parser",
    "ner",
    "spancat",
    "textcat",
    "textcat_multilabel",
)
ACCURACY_PRESET = {"parser": {"hidden_width": 128, "maxout_pieces": 3}}


def weights_and_paths(bilm: BiLMSource) -> Tuple[Optional[Dict[str, Any]], Dict[str, str]]:
    """The `[initialize.components.elmo.weights]` block that loads `bilm` (None: the bundled
    default) and the `[paths]` it reads."""
    if bilm.kind == "bundled":
        return None, {}
    if bilm.kind == "allennlp" and bilm.name in PUBLISHED_NAMES:  # downloaded when not cached
        return {"@misc": "spacy_elmo.PublishedWeights.v1", "name": bilm.name}, {}
    if bilm.kind == "allennlp":
        weights = {
            "@misc": "spacy_elmo.AllenNLPWeights.v1",
            "options_file": "${paths.elmo_options}",
            "weights_file": "${paths.elmo_weights}",
        }
        paths = {"elmo_options": str(bilm.options_file), "elmo_weights": str(bilm.weights_file)}
        return weights, paths
    loader = "spacy_elmo.SavedBiLM.v1"  # a saved biLM or a pretraining run
    if bilm.kind == "elmoformanylangs":
        loader = "spacy_elmo.ElmoForManyLangsWeights.v1"
    return {"@misc": loader, "path": "${paths.elmo_model}"}, {"elmo_model": str(bilm.path)}


def describe_bilm(bilm: BiLMSource) -> str:
    """Which biLM `bilm` is, with its size and layers (read from its options)."""
    o = bilm.options()
    return (
        f"{bilm.describe()}: {parameter_count(o.n_parameters())} parameters, "
        f"{o.n_layers + 1} layers of width {o.output_dim} (LSTM {o.lstm_dim}, projection "
        f"{o.projection_dim})"
    )


def parameter_count(n: int) -> str:
    """`n` for people: 93.6M, 2,998,480 -> 3.0M, 12,345 -> 12.3k, 800 -> 800."""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.1f}{suffix}"
    return str(n)


def elmo_training_config(
    components: List[str],
    source: BiLMSource,
    *,
    lang: str = "en",
    vectors: Optional[str] = None,
    gpu: bool = False,
    fine_tune: bool = False,
    split_sentences: bool = True,
    vector_hooks: Optional[bool] = None,
) -> Config:
    """The filled training config: `elmo` first, then `components` with their listeners.
    vector_hooks: ELMo behind `.vector` and `.similarity` of the trained pipeline (None: on
    where the pipeline has no static vectors, whose place they would take)."""
    unknown = [name for name in components if name not in COMPONENTS]
    if unknown or not components:
        raise ValueError(
            f"unknown components {unknown or components}; choose from {', '.join(COMPONENTS)}"
        )
    if len(set(components)) != len(components):
        raise ValueError(f"a component is named twice in {components}")
    weights, weights_paths = weights_and_paths(source)
    paths: Dict[str, Any] = {"train": None, "dev": None, "vectors": vectors, **weights_paths}
    config: Dict[str, Any] = {
        "paths": paths,
        "system": {"gpu_allocator": "pytorch" if gpu else None},
        "nlp": {"lang": lang, "pipeline": ["elmo", *components], "batch_size": 256},
        "components": {"elmo": _elmo_block(gpu, fine_tune, split_sentences)},
        "corpora": {
            name: {"@readers": "spacy.Corpus.v1", "path": f"${{paths.{name}}}"}
            for name in ("train", "dev")
        },
    }
    for name in components:
        tok2vec = _tok2vec_block(vectors is not None)
        # the rest of the model is its factory's default (`fill`)
        model = {**ACCURACY_PRESET.get(name, {}), "tok2vec": tok2vec}
        config["components"][name] = {"factory": name, "model": model}
    config["components"]["elmo"]["vector_hooks"] = (
        vectors is None if vector_hooks is None else vector_hooks
    )
    if weights is not None:
        config["initialize"] = {"components": {"elmo": {"weights": weights}}}
    return fill(Config(config))


def _elmo_block(gpu: bool, fine_tune: bool, split_sentences: bool) -> Dict[str, Any]:
    """The choices of `init-config`; `fill` adds the factory's defaults (the architecture null:
    from the weights at `initialize`, then written into the trained config)."""
    model = {"@architectures": MODEL, "frozen": not fine_tune}
    if gpu:
        model["batch_tokens"] = GPU_BATCH_TOKENS
    return {"factory": "elmo", "model": model, "split_sentences": split_sentences}


def _tok2vec_block(include_static_vectors: bool) -> Dict[str, Any]:
    """ElmoTok2Vec.v1: the component's ELMo mix beside spaCy's hash features, then the encoder."""
    return {
        "@architectures": TOK2VEC,
        "elmo": {"@architectures": LISTENER, **LISTENER_SETTINGS},
        "embed": {
            "@architectures": "spacy.MultiHashEmbed.v2",
            "width": TOK2VEC_WIDTH,
            "attrs": ["NORM", "PREFIX", "SUFFIX", "SHAPE"],
            "rows": [5000, 1000, 2500, 2500],
            "include_static_vectors": include_static_vectors,
        },
        "encode": {
            "@architectures": "spacy.MaxoutWindowEncoder.v2",
            "width": TOK2VEC_WIDTH,
            "depth": ENCODER_DEPTH,
            "window_size": 1,
            "maxout_pieces": 3,
        },
    }


def fill(config: Config) -> Config:
    """Every default spaCy and the factories add (what `spacy init fill-config` does)."""
    filled = load_model_from_config(config, auto_fill=True, validate=True).config
    order = CONFIG_SECTION_ORDER + [key for key in filled if key not in CONFIG_SECTION_ORDER]
    return Config({key: filled[key] for key in order if key in filled})


def config_text(config: Config) -> str:
    """The config as text, every section right after its parent (easier to read)."""
    sections = {}
    for block in ("\n" + config.to_str()).split("\n["):
        if block.strip():
            name, _, _ = block.partition("]")
            sections[name] = "[" + block.strip() + "\n"
    ordered: List[str] = []

    def visit(node: Dict[str, Any], path: str) -> None:
        for key, value in node.items():
            if isinstance(value, dict):
                name = f"{path}.{key}" if path else key
                if name in sections:
                    ordered.append(sections.pop(name))
                visit(value, name)

    visit(config, "")
    return "\n".join(ordered + list(sections.values()))


def config_header(bilm: str, components: List[str], gpu: bool) -> str:
    """Comment lines that say how the config was made (`bilm`: `describe_bilm`) and how to
    train with it."""
    command = "python -m spacy train config.cfg --paths.train TRAIN.spacy --paths.dev DEV.spacy"
    return "\n".join(
        [
            f"# spacy-elmo training config: elmo -> {', '.join(components)}",
            f"# biLM: {bilm}",
            "# Each component mixes the ELMo layers with its own weights (ElmoListener.v1). The",
            "# biLM's architecture and the listeners' widths are null here: they come from the",
            "# weights at `initialize` and are written into the trained pipeline's config.",
            "# [components.elmo] split_sentences: whether elmo cuts docs without sentence",
            "# boundaries with spaCy's sentencizer rule, in training and on raw text alike.",
            "# [components.elmo] vector_hooks: ELMo behind token.vector, doc.vector and",
            "# .similarity of the trained pipeline (on unless it has static vectors).",
            f"#   {command}{' --gpu-id 0' if gpu else ''}",
            "",
            "",
        ]
    )
