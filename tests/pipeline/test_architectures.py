"""Registered names: every entry point of setup.cfg, and the mix arguments of the listener."""

from __future__ import annotations

import configparser
import importlib
import math
from pathlib import Path

import pytest
from confection import ConfigValidationError
from spacy.util import registry
from thinc.api import Config

from spacy_elmo.layers.listener import ElmoLayersListener
from spacy_elmo.layers.scalar_mix import scalar_mix, softmax_weights_and_gamma
from spacy_elmo.pipeline import architectures

SETUP_CFG = Path(__file__).resolve().parents[2] / "setup.cfg"
REGISTRIES = {
    "spacy_architectures": registry.architectures,
    "thinc_layers": registry.layers,
    "spacy_misc": registry.misc,
}


def entry_points() -> list[tuple[str, str, str]]:
    parser = configparser.ConfigParser()
    parser.read(SETUP_CFG)
    section = parser["options.entry_points"]
    return [
        (group, *(part.strip() for part in line.split("=", 1)))
        for group in REGISTRIES
        for line in section[group].strip().splitlines()
    ]


@pytest.mark.parametrize("group, name, target", entry_points())
def test_every_entry_point_is_the_registered_function(group, name, target):
    module, _, attribute = target.partition(":")
    assert REGISTRIES[group].get(name) is getattr(importlib.import_module(module), attribute)


def test_listener_names():
    assert registry.architectures.get("spacy_elmo.ElmoListener.v1") is architectures.ElmoListener
    # The scalar mix is a Thinc layer only (`@layers`), not also an architecture.
    assert registry.layers.get("spacy_elmo.ScalarMix.v1") is scalar_mix
    assert "spacy_elmo.ScalarMix.v1" not in registry.architectures


def listener_config(**settings) -> Config:
    return Config({"m": {"@architectures": "spacy_elmo.ElmoListener.v1", "width": 8, **settings}})


def test_the_listener_takes_the_mix_arguments_with_scalar_mix_defaults():
    filled = registry.fill(listener_config())["m"]
    assert {key: filled[key] for key in architectures.MIX_KEYS} == {
        "n_layers": None,
        "layer_norm": False,
        "layer_dropout": 0.0,
        "initial_weights": None,
        "gamma": 1.0,
        "trainable": True,
    }
    with pytest.raises(ConfigValidationError, match="gama"):
        registry.fill(listener_config(gama=2.0))
    with pytest.raises(ConfigValidationError, match="layer_norm"):
        registry.fill(listener_config(layer_norm="yes please"))


def test_the_listener_passes_its_mix_arguments_to_its_scalar_mix():
    settings = dict(layer_norm=True, layer_dropout=0.25, gamma=2.0, trainable=False)
    model = registry.resolve(listener_config(initial_weights=[0.0, math.log(3.0)], **settings))
    listener, mix = model["m"].layers
    assert isinstance(listener, ElmoLayersListener) and listener.upstream_name == "*"
    assert mix.attrs["n_layers"] == 2
    assert (mix.attrs["layer_norm"], mix.attrs["layer_dropout"]) == (True, 0.25)
    assert mix.attrs["trainable"] is False
    weights, gamma = softmax_weights_and_gamma(mix)
    assert weights == pytest.approx([0.25, 0.75]) and gamma == pytest.approx(2.0)
