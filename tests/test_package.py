"""`spacy package` builds a package that installs and loads with nothing but itself."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from .conftest import REPO
from .pipeline.pipeline_util import save_tiny_bilm, tiny_nlp


def test_spacy_package_installs_and_loads(tmp_path):
    save_tiny_bilm(tmp_path / "bilm")
    nlp = tiny_nlp(tmp_path / "bilm")
    nlp.initialize()
    nlp.to_disk(tmp_path / "pipeline")
    (tmp_path / "dist").mkdir()
    run = dict(capture_output=True, text=True, timeout=300)
    result = subprocess.run(
        [sys.executable, "-m", "spacy", "package", str(tmp_path / "pipeline"),
         str(tmp_path / "dist"), "--name", "tiny_elmo", "--version", "0.0.1", "--build", "sdist"],
        **run,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    (sdist,) = (tmp_path / "dist").glob("*/dist/en_tiny_elmo-0.0.1.tar.gz")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-q",
         "--target", str(tmp_path / "site"), str(sdist)],
        **run,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    (tmp_path / "bilm" / "model.safetensors").unlink()  # the package must not need it
    code = (
        "import spacy, sys, json; nlp = spacy.load('en_tiny_elmo'); "
        "print(json.dumps(nlp('the river bank')._.elmo_layers.tolist()))"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    result = subprocess.run([sys.executable, "-c", code], env=env, **run)
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = np.array(json.loads(result.stdout.strip().splitlines()[-1]))
    expected = nlp("the river bank")._.elmo_layers
    np.testing.assert_allclose(loaded, expected, atol=1e-5)


def test_version_option_prints_the_package_version():
    from typer.testing import CliRunner

    from spacy_elmo import __version__
    from spacy_elmo.cli import app

    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"spacy-elmo {__version__}"


def test_the_version_is_written_once():
    """setup.cfg reads the version from `spacy_elmo.__version__`; nothing else states it."""
    import configparser

    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    assert setup["metadata"]["version"] == "attr: spacy_elmo.__version__"
    assert "version" not in (REPO / "pyproject.toml").read_text().split("[tool.")[0]


def _run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, timeout=1200, **kwargs)
    output = (result.stdout + result.stderr)[-4000:]
    assert result.returncode == 0, " ".join(command) + "\n" + output
    return result


def _pinned_environment(path) -> None:
    """Constraints: every distribution at this environment's version (torch stays the CPU build)."""
    from importlib import metadata

    pins = {}
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name and name not in ("spacy-elmo", "pip", "setuptools", "wheel"):
            pins[name] = dist.version
    path.write_text("".join(f"{name}=={version}\n" for name, version in sorted(pins.items())))


@pytest.mark.slow
def test_wheels_install_offline_in_a_fresh_venv(tmp_path):
    """The release: spacy-elmo's wheel and sdist pass `twine check`; a pipeline packaged with
    `spacy package --build wheel` installs with its spacy-elmo wheel from one folder with
    `pip install --no-index --find-links` into a venv that has never seen the source tree, and
    runs there in a fresh process, as docs/usage.md#shipping-a-pipeline says."""
    from spacy_elmo import __version__

    dist, wheelhouse = tmp_path / "dist", tmp_path / "wheelhouse"
    _run([sys.executable, "-m", "build", "--outdir", str(dist), str(REPO)])
    wheel = dist / f"spacy_elmo-{__version__}-py3-none-any.whl"
    sdist = dist / f"spacy_elmo-{__version__}.tar.gz"
    assert wheel.exists() and sdist.exists(), sorted(p.name for p in dist.iterdir())
    _run([sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)])
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert "spacy_elmo/data/en_elmo_bundled/model.safetensors" in names

    save_tiny_bilm(tmp_path / "bilm")
    nlp = tiny_nlp(tmp_path / "bilm")
    nlp.initialize()
    nlp.to_disk(tmp_path / "pipeline")
    (tmp_path / "packages").mkdir()
    _run([sys.executable, "-m", "spacy", "package", str(tmp_path / "pipeline"),
          str(tmp_path / "packages"), "--name", "tiny_elmo", "--version", "0.0.1",
          "--build", "wheel"])  # fmt: skip
    (pipeline_wheel,) = (tmp_path / "packages").glob("*/dist/en_tiny_elmo-0.0.1-*.whl")
    with zipfile.ZipFile(pipeline_wheel) as archive:
        (metadata_file,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        requires = archive.read(metadata_file).decode()
    assert "Requires-Dist: spacy-elmo" in requires
    shutil.copy(pipeline_wheel, dist)
    (tmp_path / "bilm" / "model.safetensors").unlink()  # the package must not need it

    # On the connected machine: every wheel the pipeline needs, into one folder.
    constraints = tmp_path / "constraints.txt"
    _pinned_environment(constraints)
    _run([sys.executable, "-m", "pip", "download", "-q", "--dest", str(wheelhouse),
          "--find-links", str(dist), "-c", str(constraints), "en_tiny_elmo==0.0.1"])  # fmt: skip
    assert (wheelhouse / wheel.name).exists()

    # On the offline machine: a fresh venv, no pip configuration, no index, no source tree.
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    python = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON"))}
    env["PIP_CONFIG_FILE"] = os.devnull
    _run([str(python), "-m", "pip", "install", "-q", "--no-index", "--find-links",
          str(wheelhouse), "en_tiny_elmo"], env=env, cwd=tmp_path)  # fmt: skip

    code = (
        "import json, spacy, spacy_elmo; nlp = spacy.load('en_tiny_elmo'); "
        "print(json.dumps([spacy_elmo.__file__, "
        "nlp('the river bank')._.elmo_layers.tolist()]))"
    )
    result = _run([str(python), "-c", code], env=env, cwd=tmp_path / "packages")
    location, layers = json.loads(result.stdout.strip().splitlines()[-1])
    assert Path(location).is_relative_to(venv), location
    expected = nlp("the river bank")._.elmo_layers
    np.testing.assert_allclose(np.array(layers), expected, atol=1e-5)
    result = _run([str(venv / "bin" / "spacy-elmo"), "--version"], env=env, cwd=tmp_path)
    assert result.stdout.strip() == f"spacy-elmo {__version__}"
