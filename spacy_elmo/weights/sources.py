"""Where a biLM comes from: `resolve_source`, the one resolver behind every way of naming one
(the commands' --model, pretraining's `init_from`, the registered loaders, `BiLM.load`); the
names it takes are ACCEPTED. A published name is read from the cache that `spacy-elmo download`
fills, never downloaded here; `BiLM.load` reads each kind with its reader."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from ..description.options import BiLMOptions
from ..util.files import files_sha256
from .elmoformanylangs import is_elmoformanylangs_dir, read_elmoformanylangs
from .layouts import CONFIG_NAME, WEIGHTS_NAME, MissingFileError, read_saved_options
from .published import CACHE_VARIABLE, PUBLISHED, cached_files, published_model

PathLike = Union[str, Path]

BUNDLED_NAME = "bundled"
BUNDLED_DIR = Path(__file__).resolve().parent.parent / "data" / "en_elmo_bundled"
# The published bilm-tf/AllenNLP English models, by the names `spacy-elmo download` takes.
PUBLISHED_NAMES = tuple(PUBLISHED)
# A run directory of `spacy-elmo pretrain` keeps its biLM here.
RUN_MODEL_DIR = "model"
ACCEPTED = (
    f"'bundled', a published model ({', '.join(PUBLISHED_NAMES)}), a directory written by "
    "BiLM.save, a `spacy-elmo pretrain` run directory, a folder with one *options*.json and "
    "one *weights*.hdf5 (bilm-tf/AllenNLP), or an ELMoForManyLangs model directory"
)


@dataclass(frozen=True)
class BiLMSource:
    """A resolved biLM source: what kind it is and the files it is read from."""

    kind: str
    name: str  # as the user gave it
    path: Optional[Path] = None  # the folder read (None for an explicit options + weights pair)
    options_file: Optional[Path] = None
    weights_file: Optional[Path] = None

    def options(self) -> BiLMOptions:
        """The architecture, read without the weights where the format allows."""
        if self.kind == "allennlp":
            return BiLMOptions.from_file(self.options_file)
        if self.kind == "elmoformanylangs":
            return read_elmoformanylangs(self.path)[0]
        return read_saved_options(self.path)

    def files(self) -> list[Path]:
        """The files the biLM is read from (the weights and what describes them)."""
        if self.kind == "allennlp":
            return [self.options_file, self.weights_file]
        return sorted(p for p in self.path.iterdir() if p.is_file())

    def fingerprint(self) -> str:
        """sha256 over the names and bytes of `files()`: equal for the same biLM."""
        return files_sha256((path.name.encode("utf-8"), path) for path in self.files())

    def describe(self) -> str:
        """A phrase for messages: which biLM this is."""
        if self.kind == "bundled":
            return "the bundled English biLM"
        if self.kind == "allennlp" and self.name in PUBLISHED_NAMES:
            return f"the published AllenNLP biLM '{self.name}' ({self.path})"
        if self.kind == "allennlp":
            return f"the bilm-tf/AllenNLP biLM {self.options_file} + {self.weights_file}"
        if self.kind == "run":
            return f"the biLM of the pretraining run {self.path.parent}"
        if self.kind == "elmoformanylangs":
            return f"the ELMoForManyLangs biLM in {self.path}"
        return f"the biLM in {self.path}"


def resolve_source(
    source: Optional[PathLike] = None,
    options: Optional[PathLike] = None,
    weights: Optional[PathLike] = None,
) -> BiLMSource:
    """Which biLM `source` names (one of ACCEPTED); `options` and `weights` name a
    bilm-tf/AllenNLP pair instead. ValueError (a MissingFileError for a missing file) says
    what was wrong."""
    if options is not None or weights is not None:
        if source is not None and str(source) != BUNDLED_NAME:
            raise ValueError(
                f"a biLM is named twice: model {source} and options/weights files; give one"
            )
        if options is None or weights is None:
            given, missing = ("options", "weights") if weights is None else ("weights", "options")
            raise ValueError(f"a bilm-tf/AllenNLP {given} file needs its {missing} file too")
        options, weights = Path(options), Path(weights)
        for path, what in ((options, "options"), (weights, "weights")):
            if not path.is_file():
                raise MissingFileError(f"bilm-tf/AllenNLP {what} file {path} does not exist")
        return BiLMSource("allennlp", f"{options} + {weights}", None, options, weights)
    name = BUNDLED_NAME if source is None else str(source)
    if name == BUNDLED_NAME:
        if not (BUNDLED_DIR / WEIGHTS_NAME).is_file():
            raise MissingFileError(
                f"the bundled English biLM is not in this installation ({BUNDLED_DIR}); name "
                f"another biLM: {ACCEPTED}"
            )
        return BiLMSource("bundled", name, BUNDLED_DIR)
    if name in PUBLISHED_NAMES:  # in the cache (a folder of that name is `./NAME`)
        files = cached_files(name)
        if files is None:
            folder = published_model(name).folder()
            raise MissingFileError(
                f"biLM '{name}' is a published AllenNLP model that is not downloaded (not in "
                f"{folder}); run `spacy-elmo download {name}` (or set {CACHE_VARIABLE} to the "
                f"cache that holds it; a folder named '{name}' is ./{name})"
            )
        options, weights = files
        return BiLMSource("allennlp", name, options.parent, options, weights)
    path = Path(name).expanduser()
    if not path.exists():
        raise MissingFileError(f"biLM {name} does not exist; name {ACCEPTED}")
    if path.is_file():
        raise ValueError(
            f"biLM {name} is a file; name the folder that holds it ({ACCEPTED}), or give a "
            "bilm-tf/AllenNLP pair as options and weights"
        )
    return _resolve_directory(name, path)


def _resolve_directory(name: str, path: Path) -> BiLMSource:
    if is_elmoformanylangs_dir(path):
        return BiLMSource("elmoformanylangs", name, path)
    for kind, folder in (("saved", path), ("run", path / RUN_MODEL_DIR)):
        if (folder / CONFIG_NAME).exists() or (folder / WEIGHTS_NAME).exists():
            return BiLMSource(kind, name, folder)
    options = sorted(path.glob("*options*.json"))
    weights = sorted(path.glob("*weights*.hdf5"))
    if len(options) == 1 and len(weights) == 1:
        return BiLMSource("allennlp", name, path, options[0], weights[0])
    if options or weights:
        found = ", ".join(p.name for p in options + weights)
        raise ValueError(
            f"biLM folder {name} holds {found}: a bilm-tf/AllenNLP folder needs exactly one "
            "*options*.json and one *weights*.hdf5 (or give the two files as options and weights)"
        )
    raise ValueError(f"biLM folder {name} holds no biLM; name {ACCEPTED}")
