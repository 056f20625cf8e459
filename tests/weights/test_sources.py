"""One way to name a biLM: every entry point x every kind of source, through bilm.sources.

Each entry point is given each kind of source and must read the biLM it holds (the model saved
there, or what that kind's own loader reads): the bundled model, a `BiLM.save` directory, a
`spacy-elmo pretrain` run directory and its `model/`, a bilm-tf/AllenNLP folder, and an
ELMoForManyLangs directory.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import h5py
import numpy
import pytest
from typer.testing import CliRunner

from spacy_elmo import BiLM
from spacy_elmo.cli import app
from spacy_elmo.weights.sources import resolve_source

from ..bilm.util import same_weights
from .test_elmoformanylangs import make_model

KINDS = ("bundled", "saved", "run", "run_model", "allennlp", "elmoformanylangs")
WORDS = [["The", "river", "bank", "."], ["ok"]]


@pytest.fixture(scope="module")
def sources(tmp_path_factory, allennlp_fixture) -> dict[str, tuple[str, BiLM]]:
    """Each kind of source: its name and the biLM it holds."""
    root = tmp_path_factory.mktemp("sources")
    allennlp = root / "allennlp"
    allennlp.mkdir()
    for name in ("options.json", "lm_weights.hdf5"):
        shutil.copy(allennlp_fixture / name, allennlp / name)
    reference = BiLM.from_allennlp(allennlp / "options.json", allennlp / "lm_weights.hdf5")
    reference.save(root / "saved")
    shutil.copytree(root / "saved", root / "run" / "model")
    efml, _, _ = make_model(root, 5)
    return {
        "bundled": ("bundled", BiLM.load(resolve_source().path)),  # its folder, by path
        "saved": (str(root / "saved"), reference),
        "run": (str(root / "run"), reference),
        "run_model": (str(root / "run" / "model"), reference),
        "allennlp": (str(allennlp), reference),
        "elmoformanylangs": (str(efml), BiLM.from_elmoformanylangs(efml)),
    }


@pytest.mark.parametrize("kind", KINDS)
def test_bilm_load(sources, kind):
    name, reference = sources[kind]
    same_weights(BiLM.load(name), reference)


@pytest.mark.parametrize("kind", KINDS)
def test_registered_weight_loader(sources, kind):
    from spacy_elmo.pipeline.loaders import allennlp_weights, elmoformanylangs_weights, saved_bilm

    name, reference = sources[kind]
    same_weights(saved_bilm(Path(name))(), reference)
    if kind == "elmoformanylangs":
        same_weights(elmoformanylangs_weights(Path(name))(), reference)
    elif kind != "bundled":
        with pytest.raises(ValueError, match="is not an ELMoForManyLangs model directory"):
            elmoformanylangs_weights(Path(name))()
    if kind == "allennlp":
        files = resolve_source(name)
        same_weights(allennlp_weights(files.options_file, files.weights_file)(), reference)


@pytest.mark.parametrize("kind", KINDS)
def test_embed_command(sources, kind, tmp_path):
    name, reference = sources[kind]
    text = tmp_path / "in.txt"
    text.write_text("\n".join(" ".join(words) for words in WORDS) + "\n", encoding="utf-8")
    out = tmp_path / "out.hdf5"
    result = CliRunner().invoke(app, ["embed", str(text), str(out), "--model", name, "-q"])
    assert result.exit_code == 0, result.output
    expected = reference.embed(WORDS)
    with h5py.File(out) as written:
        for index, vectors in enumerate(expected):
            numpy.testing.assert_allclose(written[str(index)][()], vectors, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_init_config_command(sources, kind, tmp_path):
    """The written config names a loader that reads the same biLM."""
    from spacy.util import load_config, registry

    name, reference = sources[kind]
    path = tmp_path / "config.cfg"
    result = CliRunner().invoke(app, ["init-config", str(path), "-p", "ner", "--model", name])
    assert result.exit_code == 0, result.output
    config = load_config(path, interpolate=True)
    block = config["initialize"]["components"].get("elmo", {}).get("weights")
    if kind == "bundled":
        assert block is None  # the component's default: the bundled biLM
        return
    loader = registry.resolve({"weights": block})["weights"]
    same_weights(loader(), reference)


@pytest.mark.parametrize("kind", KINDS)
def test_pretrain_init_from(sources, kind):
    from spacy_elmo.pretrain.objective import load_init_model

    name, reference = sources[kind]
    bilm, vocab, head = load_init_model(name)
    same_weights(bilm, reference)
    # The softmax comes along where the source has one: the bundled model and pretrain runs.
    assert (vocab is not None) == (kind == "bundled")


@pytest.mark.parametrize("kind", KINDS)
def test_perplexity_command(sources, kind, tmp_path):
    """Sources with a softmax give a perplexity; the others say they hold none."""
    name, _ = sources[kind]
    text = tmp_path / "held_out.txt"
    text.write_text("the river bank flooded .\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["perplexity", str(text), "--model", name, "--pretokenized"])
    if kind == "bundled":
        assert result.exit_code == 0, result.output
        assert '"ppl"' in result.output
    else:
        assert result.exit_code == 1
        assert "has no softmax" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("kind", KINDS)
def test_probe_command_resolves_before_it_needs_data(sources, kind, tmp_path):
    """The biLM is resolved (or refused) before the probe data are looked for."""
    name, _ = sources[kind]
    result = CliRunner().invoke(
        app, ["probe", str(tmp_path / "out"), "--assets", str(tmp_path / "none"), "-m", name]
    )
    assert result.exit_code == 1
    assert "biLM" not in result.output and "Traceback" not in result.output
