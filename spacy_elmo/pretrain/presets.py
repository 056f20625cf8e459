"""Named biLM architectures, the `preset` setting of pretraining (bilm-tf options dicts)."""

from __future__ import annotations

import copy
from typing import Any

ELMO_FILTERS = [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]]


def _options(filters, n_highway, dim, projection_dim, embedding_dim=16) -> dict[str, Any]:
    return {
        "char_cnn": {
            "activation": "relu",
            "embedding": {"dim": embedding_dim},
            "filters": filters,
            "max_characters_per_token": 50,
            "n_characters": 262,
            "n_highway": n_highway,
        },
        "lstm": {
            "cell_clip": 3,
            "dim": dim,
            "n_layers": 2,
            "proj_clip": 3,
            "projection_dim": projection_dim,
            "use_skip_connections": True,
        },
    }


PRESETS: dict[str, dict[str, Any]] = {
    # For tests and smoke runs: trains in seconds.
    "tiny": _options([[1, 8], [2, 8], [3, 16]], 1, 32, 16, embedding_dim=4),
    # The bundled English model: sized to train in about 90 minutes on 2 CPU cores.
    "bundled": _options([[1, 32], [2, 32], [3, 64], [4, 128], [5, 128], [6, 128]], 1, 512, 128),
    # The published AllenNLP shapes (their parameter counts: PUBLISHED_PARAMETERS).
    "small": _options(ELMO_FILTERS, 1, 1024, 128),
    "medium": _options(ELMO_FILTERS, 1, 2048, 256),
    "original": _options(ELMO_FILTERS, 2, 4096, 512),
}


# The parameter counts of the published AllenNLP models of these shapes (their weights files).
PUBLISHED_PARAMETERS = {"small": 13_593_296, "medium": 28_027_728, "original": 93_600_848}


def preset(name: str) -> dict[str, Any]:
    """A copy of the options dict of a named architecture."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return copy.deepcopy(PRESETS[name])
