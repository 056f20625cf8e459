"""`spacy package` builds a package that installs and loads with nothing but itself."""

from __future__ import annotations

import json
import os
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


# The network indexes that docs/usage.md's `pip download` names; offline, the machine's own pip
# configuration (a local wheel folder or file:// index) stands in for them.
NETWORK_INDEXES = ("--index-url https://download.pytorch.org/whl/cpu",
                   "--extra-index-url https://pypi.org/simple")  # fmt: skip
TARGET_MARK = "# copy wheelhouse/ to the target machine"


def shipping_recipe() -> tuple[list[str], list[str]]:
    """The commands of docs/usage.md#shipping-a-pipeline's code block, continuation lines
    joined: (those run where the source is, those run on the target machine)."""
    page = (REPO / "docs" / "usage.md").read_text(encoding="utf-8")
    section = page.split("\n## Shipping a pipeline\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    source, target = [], []
    current = source
    for line in block.replace("\\\n", " ").splitlines():
        if line.startswith(TARGET_MARK):
            current = target
        if line.strip() and not line.lstrip().startswith("#"):
            current.append(" ".join(line.split()))
    return source, target


def _local_pip_source() -> bool:
    """Whether pip finds packages on this machine without the network (find-links or a file://
    index in its configuration or environment)."""
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                            capture_output=True, text=True).stdout  # fmt: skip
    settings = listed + " ".join(v for k, v in os.environ.items() if k.startswith("PIP_"))
    return "find-links" in listed or "PIP_FIND_LINKS" in os.environ or "file://" in settings


def _bash(command: str, **kwargs) -> subprocess.CompletedProcess:
    return _run(["bash", "-euo", "pipefail", "-c", command], **kwargs)


@pytest.mark.slow
def test_wheels_install_offline_in_a_fresh_venv(tmp_path):
    """The release, as docs/usage.md#shipping-a-pipeline writes it: its code block's commands
    run as they are, in a folder of their own with a tiny pipeline in training/model-best
    (`python -m build ... .` builds this checkout; the two network indexes of `pip download`
    are left to the machine's own pip configuration). spacy-elmo's wheel and sdist pass
    `twine check`; the packaged pipeline installs with its spacy-elmo wheel from the wheelhouse
    with `--no-index` into a venv that has never seen the source tree (no pip configuration),
    and runs there in a fresh process."""
    from spacy_elmo import __version__

    source_steps, target_steps = shipping_recipe()
    download = next(step for step in source_steps if step.startswith("pip download"))
    for index in NETWORK_INDEXES:
        assert index in download, download  # the substitution below still applies
        download = download.replace(index + " ", "")
    if not _local_pip_source():
        pytest.skip("`pip download` needs the network (PyPI and PyTorch's CPU index) or a local "
                    "wheel folder in pip's configuration; this machine has neither")  # fmt: skip
    source_steps = [download if s.startswith("pip download") else s for s in source_steps]
    build = next(step for step in source_steps if step.startswith("python -m build"))
    assert build.split("#")[0].split()[-1] == ".", build  # run from the checkout
    source_steps = [
        s.replace(build, f"{build.split('#')[0].strip()[:-1]}{REPO}") for s in source_steps
    ]

    save_tiny_bilm(tmp_path / "bilm")
    nlp = tiny_nlp(tmp_path / "bilm")
    nlp.initialize()
    (tmp_path / "training").mkdir()
    nlp.to_disk(tmp_path / "training" / "model-best")
    (tmp_path / "bilm" / "model.safetensors").unlink()  # the package must not need it
    here = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for step in source_steps:  # python and pip: this environment's
        _bash(step, cwd=tmp_path, env=here)

    dist = tmp_path / "dist"
    wheel = dist / f"spacy_elmo-{__version__}-py3-none-any.whl"
    sdist = dist / f"spacy_elmo-{__version__}.tar.gz"
    assert wheel.exists() and sdist.exists(), sorted(p.name for p in dist.iterdir())
    _run([sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)])
    with zipfile.ZipFile(wheel) as archive:
        assert "spacy_elmo/data/en_elmo_bundled/model.safetensors" in set(archive.namelist())
    (pipeline_wheel,) = dist.glob("en_elmo_demo-1.0.0-*.whl")
    with zipfile.ZipFile(pipeline_wheel) as archive:
        (metadata_file,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        assert "Requires-Dist: spacy-elmo" in archive.read(metadata_file).decode()
    wheelhouse = tmp_path / "wheelhouse"
    assert (wheelhouse / wheel.name).exists()
    torches = [p.name for p in wheelhouse.glob("torch-*.whl")]
    assert len(torches) == 1 and torches[0].startswith("torch-2.13.0"), torches

    # On the offline machine: a fresh venv, no pip configuration, no index, no source tree.
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    there = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON"))}
    there.update(PIP_CONFIG_FILE=os.devnull, VIRTUAL_ENV=str(venv),
                 PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}")  # fmt: skip
    results = [_bash(step, cwd=tmp_path, env=there) for step in target_steps]
    assert results[-1].stdout.strip().splitlines()[-1] == "()"  # the tiny pipeline has no NER

    code = (
        "import json, spacy, spacy_elmo; nlp = spacy.load('en_elmo_demo'); "
        "print(json.dumps([spacy_elmo.__file__, "
        "nlp('the river bank')._.elmo_layers.tolist()]))"
    )
    result = _run([str(venv / "bin" / "python"), "-c", code], env=there, cwd=tmp_path / "packages")
    location, layers = json.loads(result.stdout.strip().splitlines()[-1])
    assert Path(location).is_relative_to(venv), location
    expected = nlp("the river bank")._.elmo_layers
    np.testing.assert_allclose(np.array(layers), expected, atol=1e-5)
    result = _run([str(venv / "bin" / "spacy-elmo"), "--version"], env=there, cwd=tmp_path)
    assert result.stdout.strip() == f"spacy-elmo {__version__}"
