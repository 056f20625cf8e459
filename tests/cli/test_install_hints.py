"""Install hints name the requirement itself with its version range, as setup.cfg declares it
(read back from the installed package's metadata), and the extra for a clone of the source: a
hint that pip can resolve however spacy-elmo was installed."""

from __future__ import annotations

import configparser
import logging
import sys
import warnings
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from typer.testing import CliRunner

from spacy_elmo.cli import app
from spacy_elmo.util import extras

SETUP_CFG = Path(__file__).resolve().parents[2] / "setup.cfg"


def declared() -> dict[str, list[Requirement]]:
    """setup.cfg's [options.extras_require], parsed here on its own."""
    parser = configparser.ConfigParser()
    parser.read(SETUP_CFG, encoding="utf-8")
    found = {}
    for extra, text in parser["options.extras_require"].items():
        lines = [line.split("#")[0].strip() for line in text.splitlines()]
        found[extra] = [Requirement(line) for line in lines if line]
    return found


CASES = [(extra, r) for extra, requirements in declared().items() for r in requirements]


@pytest.mark.parametrize("extra, declared_requirement", CASES, ids=[f"{e}:{r}" for e, r in CASES])
def test_each_requirement_of_each_extra_is_setup_cfgs(extra, declared_requirement):
    text = extras.install_hint(extra, declared_requirement.name)
    requirement = text.split("pip install '")[1].split("'")[0]
    said = Requirement(requirement)
    assert said.name == declared_requirement.name
    assert said.specifier == declared_requirement.specifier  # the same range
    bounds = requirement[len(said.name) :].split(",")
    assert bounds == sorted(bounds, key=lambda b: not b.startswith(">"))  # lower bounds first


def test_the_hints_of_ray_and_matplotlib():
    ray = next(r for r in declared()["ray"] if r.name == "ray")
    assert extras.install_hint("ray", "ray") == (
        f"pip install 'ray{','.join(sorted(map(str, ray.specifier), reverse=True))}' "
        "(in a clone of spacy-elmo's source: pip install -e '.[ray]')"
    )
    assert extras.install_hint("pretrain", "matplotlib") == (
        "pip install 'matplotlib>=3.5' (in a clone of spacy-elmo's source: pip install -e "
        "'.[pretrain]')"
    )


def test_embed_corpus_without_ray_names_ray_and_its_range(tmp_path, monkeypatch):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("a b\n")
    monkeypatch.setitem(sys.modules, "ray", None)
    args = ["embed-corpus", str(tmp_path / "in"), str(tmp_path / "out"), "--workers", "1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1
    ray = next(r for r in declared()["ray"] if r.name == "ray")
    line = result.stderr.strip()
    assert "'spacy-elmo[ray]'" not in line
    assert Requirement(line.split("pip install '")[1].split("'")[0]) == ray
    assert line.endswith("pip install -e '.[ray]')")


def test_pretrain_without_matplotlib_names_matplotlib_and_its_extra(tmp_path, monkeypatch, caplog):
    from spacy_elmo.pretrain import PretrainConfig, pretrain

    text = tmp_path / "corpus.txt"
    text.write_text("the river bank was muddy .\n" * 200, encoding="utf-8")
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    config = PretrainConfig(
        inputs=[str(text)], output=str(tmp_path / "run"), preset="tiny", vocab_size=50,
        min_count=1, batch_tokens=128, max_steps=2, warmup_steps=2, eval_every=2,
        checkpoint_every=2, pretokenized=True,
    )  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="spacy_elmo"):
        pretrain(config, progress=False)
    said = [r.getMessage() for r in caplog.records if "matplotlib" in r.getMessage()]
    assert said == [
        "matplotlib is not installed: no perplexity plot; pip install 'matplotlib>=3.5' (in a "
        "clone of spacy-elmo's source: pip install -e '.[pretrain]')"
    ]
    assert not (tmp_path / "run" / "perplexity.png").exists()


def test_probe_without_matplotlib_names_matplotlib_and_its_extra(tmp_path, monkeypatch, bilm_dir):
    from ..probes.test_probe import write_assets

    assets = write_assets(tmp_path / "assets")
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    args = ["probe", tmp_path / "out", "--assets", assets, "--model", bilm_dir, "-q"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = CliRunner().invoke(app, [str(a) for a in [*args, "--brown-sentences", "10"]])
    assert result.exit_code == 0, result.output
    said = [str(w.message) for w in caught if "matplotlib" in str(w.message)]
    assert said == [
        "matplotlib is not installed: no probe.png; pip install 'matplotlib>=3.5' (in a clone of "
        "spacy-elmo's source: pip install -e '.[pretrain]')"
    ]
    assert not (tmp_path / "out" / "probe.png").exists()
