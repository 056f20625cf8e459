"""The `elmo` component's `quantize` setting: bfloat16 layers close to float32's,
kept through the config and nlp.to_disk / spacy.load, and switched on for a saved float32
pipeline."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import spacy

from spacy_elmo.bilm.quantize import Bf16SpeedWarning, set_quantize
from spacy_elmo.layers.elmo_model import get_bilm

from .pipeline_util import tiny_nlp

MODES = ["bf16"]
TEXTS = ["Anna visited Paris in May .", "The bank left a river behind , said Ben ."]


def layers(nlp) -> list[np.ndarray]:
    return [doc._.elmo_layers for doc in nlp.pipe(TEXTS)]


@pytest.fixture(scope="module")
def float32_layers(bilm_dir):
    nlp = tiny_nlp(bilm_dir)
    nlp.initialize()
    return layers(nlp)


@pytest.fixture(autouse=True)
def _no_speed_warning():
    """The CPU may lack fast bfloat16 kernels: slower there, the same numbers."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Bf16SpeedWarning)
        yield


@pytest.mark.parametrize("mode", MODES)
def test_quantised_component_is_close_to_float32(bilm_dir, float32_layers, mode):
    nlp = tiny_nlp(bilm_dir, quantize=mode)
    nlp.initialize()
    assert nlp.get_pipe("elmo").cfg["quantize"] == mode
    quantised = layers(nlp)
    assert get_bilm(nlp.get_pipe("elmo").model).quantize == mode
    for got, ref in zip(quantised, float32_layers):
        relative = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        assert 1e-4 < relative < 0.05, relative  # quantised, and close


@pytest.mark.parametrize("mode", MODES)
def test_quantised_layers_are_those_of_the_quantised_bilm(bilm_dir, mode):
    from spacy_elmo import BiLM

    nlp = tiny_nlp(bilm_dir, quantize=mode)
    nlp.initialize()
    bilm = set_quantize(BiLM.load(bilm_dir), mode)
    for doc in nlp.pipe(TEXTS):
        (expected,) = bilm.embed([[t.text for t in doc]])
        np.testing.assert_allclose(doc._.elmo_layers, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_setting_round_trips_through_to_disk(bilm_dir, tmp_path, float32_layers, mode):
    nlp = tiny_nlp(bilm_dir, quantize=mode)
    nlp.initialize()
    before = layers(nlp)
    nlp.to_disk(tmp_path / mode)
    loaded = spacy.load(tmp_path / mode)
    assert loaded.config["components"]["elmo"]["quantize"] == mode
    assert loaded.get_pipe("elmo").cfg["quantize"] == mode
    for got, want in zip(layers(loaded), before):
        np.testing.assert_array_equal(got, want)
    # and off again at load
    off = spacy.load(tmp_path / mode, config={"components": {"elmo": {"quantize": None}}})
    for got, want in zip(layers(off), float32_layers):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_bf16_switched_on_for_a_saved_float32_pipeline(bilm_dir, tmp_path, float32_layers):
    nlp = tiny_nlp(bilm_dir)
    nlp.initialize()
    nlp.to_disk(tmp_path / "float32")
    bf16_nlp = tiny_nlp(bilm_dir, quantize="bf16")
    bf16_nlp.initialize()
    expected = layers(bf16_nlp)
    loaded = spacy.load(tmp_path / "float32", config={"components.elmo.quantize": "bf16"})
    assert loaded.get_pipe("elmo").cfg["quantize"] == "bf16"
    for got, want in zip(layers(loaded), expected):
        np.testing.assert_array_equal(got, want)
    # or on a loaded pipeline, from its next call on
    again = spacy.load(tmp_path / "float32")
    for got, want in zip(layers(again), float32_layers):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    again.get_pipe("elmo").cfg["quantize"] = "bf16"
    for got, want in zip(layers(again), expected):
        np.testing.assert_array_equal(got, want)


def test_unknown_setting_is_refused(bilm_dir):
    with pytest.raises(ValueError, match="quantize of the 'elmo' component must be one of"):
        tiny_nlp(bilm_dir, quantize="int4")


@pytest.mark.parametrize("value", ["int8", "int4"])
def test_unsupported_precision_is_refused_with_the_supported_ones(bilm_dir, value):
    with pytest.raises(ValueError, match=f"must be one of 'none', 'bf16' or null, got '{value}'"):
        tiny_nlp(bilm_dir, quantize=value)


def test_the_config_is_the_one_store_of_the_setting(bilm_dir, tmp_path):
    """The component reads `quantize` from its config at each biLM call: a change of the
    config holds from the next call, also after saving and loading; a bad value is named."""
    nlp = tiny_nlp(bilm_dir, quantize="bf16")
    nlp.initialize()
    elmo = nlp.get_pipe("elmo")
    assert not hasattr(elmo, "quantize")  # no second store on the component
    nlp("Anna visited Paris .")
    assert get_bilm(elmo.model).quantize == "bf16"
    elmo.cfg["quantize"] = "none"
    nlp("Anna visited Paris .")
    assert get_bilm(elmo.model).quantize is None
    elmo.cfg["quantize"] = "bf16"
    nlp.to_disk(tmp_path / "p")
    loaded = spacy.load(tmp_path / "p")
    loaded("Anna visited Paris .")
    assert get_bilm(loaded.get_pipe("elmo").model).quantize == "bf16"
    elmo.cfg["quantize"] = "int8"
    with pytest.raises(ValueError, match="must be one of 'none', 'bf16' or null, got 'int8'"):
        nlp("Anna visited Paris .")
