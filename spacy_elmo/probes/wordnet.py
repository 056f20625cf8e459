"""WordNet 3.0 for the word-sense probe: its data files, WordNet's own morphology (Morphy's
detachment rules and exception lists) and the sense-labelled tokens of the glosses' example
sentences: each is labelled with its synset at the token that is an inflection of one of the
synset's single-word lemmas (`base_forms`)."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

POS_FILES = {"n": "noun", "v": "verb", "a": "adj", "r": "adv"}
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
_TOKEN = re.compile(
    r"(?:[a-z]\.){2,}|\w+(?=n't\b)|n't\b|'(?:s|re|ve|ll|d|m)\b|\w+(?:[-.]\w+)*|--+|\S", re.I
)


@dataclass(frozen=True)
class Synset:
    offset: int
    pos: str  # n, v, a (satellites included), r
    lemmas: tuple[str, ...]  # lowercased, '_' for spaces as in the data files
    examples: tuple[str, ...]  # the quoted sentences of the gloss


@dataclass(frozen=True)
class SenseInstance:
    words: tuple[str, ...]
    target: int  # index of the sense-labelled token in `words`
    lemma: str  # "bank.n": lemma and part of speech
    sense: str  # "bank.n.09213565": lemma, part of speech and synset offset


def read_wordnet_data(path: Path) -> list[Synset]:
    """The synsets of one data.{noun,verb,adj,adv} file (licence header lines skipped)."""
    synsets = []
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if line.startswith("  ") or not line.strip():
                continue
            head, _, gloss = line.partition("|")
            fields = head.split()
            try:
                offset, pos, count = int(fields[0]), fields[2], int(fields[3], 16)
                words = fields[4 : 4 + 2 * count : 2]
            except (IndexError, ValueError) as err:
                raise ValueError(f"{path}:{number} is not a WordNet data line: {err}") from err
            lemmas = tuple(_ADJ_MARKER.sub("", w).lower() for w in words)
            examples = tuple(e.strip() for e in _EXAMPLE.findall(gloss) if e.strip())
            synsets.append(Synset(offset, "a" if pos == "s" else pos, lemmas, examples))
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


def tokenize_example(text: str) -> list[str]:
    """Words and punctuation, with clitics split off the PTB way (did n't, John 's)."""
    return _TOKEN.findall(text)


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
        for synset in read_wordnet_data(folder / f"data.{name}"):
            examples = [tuple(tokenize_example(e)) for e in synset.examples]
            for lemma in dict.fromkeys(synset.lemmas):
                if "_" in lemma or len(lemma) < 2:  # phrases; letters and symbols (a, i, x)
                    continue
                key = f"{lemma}.{pos}"
                sense = f"{key}.{synset.offset:08d}"
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
