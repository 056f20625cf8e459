"""Layer probes of Peters et al. (2018), section 5.3, on a frozen biLM.

Per biLM layer: (a) a linear softmax POS tagger trained on the frozen token vectors, next to
the most-frequent-tag baseline, and (b) 1-nearest-neighbour word sense disambiguation over
sense centroids (Melamud et al. 2016), next to the most-frequent-sense baseline.

Data, all read from an asset folder (see `ASSETS`):
- WSJ sample: one line of `word/TAG` tokens per line (a line may hold several sentences); the
  first 80% of the lines train, the last 20% test.
- Brown corpus (Form C): files `ca01` ... `cr09`, one sentence a line. A seeded sample of
  sentences, shuffled, split 80/20. Tags are mapped with `brown_tag`.
- WordNet 3.0 data files: the quoted example sentences of each synset, labelled with the synset
  at the token that is an inflection of one of its single-word lemmas (`base_forms`).
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy
import torch

TASKS = ("pos-wsj", "pos-brown", "wsd")
# Where each data set lies inside the asset folder, and its `workflow/fetch_assets.py` name.
ASSETS = {
    "pos-wsj": ("wsj_sample/tagged-en-wsj.txt", "wsj_sample"),
    "pos-brown": ("brown/package", "brown"),
    "wsd": ("wordnet/usr/share/wordnet", "wordnet"),
}
TRAIN_FRACTION = 0.8
# Peters et al. 2018, table 5 (WSD, SemCor -> Senseval/SemEval all-words F1) and table 6 (POS,
# WSJ, full training set), for the biLM's first and second LSTM layer.
PAPER = {"pos": {1: 97.3, 2: 96.8}, "wsd": {1: 67.4, 2: 69.0}}
BROWN_NOTE = (
    "Brown is part of the bundled biLM's pretraining text (tags stripped): the Brown probe "
    "tests on sentences the biLM has read."
)

TaggedSentence = tuple[list[str], list[str]]


# ---------------------------------------------------------------------------------- POS data


def split_tagged_token(token: str, source: str = "") -> tuple[str, str]:
    """`word/TAG` -> (word, TAG), splitting on the last '/' (a word may contain '/')."""
    word, slash, tag = token.rpartition("/")
    if not slash or not word or not tag:
        raise ValueError(f"token {token!r} in {source or 'input'} is not of the form word/TAG")
    return word, tag


def read_tagged_lines(path: Path, map_tag=None) -> list[TaggedSentence]:
    """One (words, tags) pair per non-empty line of space-separated `word/TAG` tokens."""
    sentences = []
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            tokens = line.split()
            if not tokens:
                continue
            pairs = [split_tagged_token(t, f"{path}:{number}") for t in tokens]
            words = [w for w, _ in pairs]
            tags = [map_tag(t) if map_tag else t for _, t in pairs]
            sentences.append((words, tags))
    return sentences


def read_wsj(path: Path) -> list[TaggedSentence]:
    """The tagged WSJ sample: PTB tags as they are."""
    return read_tagged_lines(path)


_BROWN_FILE = re.compile(r"c[a-r]\d\d(\.\w+)?")
_BROWN_MARKERS = re.compile(r"(?:-(?:tl|hl|nc|t|n))+$")


def brown_tag(tag: str) -> str:
    """A Brown tag reduced to its base tag, so that the tag set stays small (about 100 tags).

    The title (-tl), headline (-hl) and cited-word (-nc) markers are dropped (with the two
    truncated spellings -t and -n that occur), foreign words (fw-xx) become `fw`, and a
    contraction's compound tag (ppss+bem for "I'm") keeps its first part. Negation (md*) stays.
    """
    tag = tag.lower()
    if tag.startswith("fw-"):
        return "fw"
    tag = _BROWN_MARKERS.sub("", tag) or tag
    return tag.split("+")[0]


def brown_files(folder: Path) -> list[Path]:
    """The 500 text files of the Brown corpus (ca01 ... cr09, any extension), in name order."""
    files = sorted(p for p in Path(folder).iterdir() if _BROWN_FILE.fullmatch(p.name.lower()))
    if not files:
        raise FileNotFoundError(f"no Brown corpus files (ca01 ... cr09) in {folder}")
    return files


def read_brown(folder: Path) -> list[TaggedSentence]:
    """Every sentence of the Brown corpus, files in name order, tags mapped by `brown_tag`."""
    return [s for path in brown_files(folder) for s in read_tagged_lines(path, brown_tag)]


def sample_sentences(sentences: Sequence, n: int, seed: int) -> list:
    """`n` sentences drawn without replacement in a seeded random order (all if n >= len)."""
    rng = random.Random(seed)
    return [sentences[i] for i in rng.sample(range(len(sentences)), min(n, len(sentences)))]


def split_train_test(items: Sequence, fraction: float = TRAIN_FRACTION) -> tuple[list, list]:
    """The first `fraction` of the items train, the rest test."""
    cut = int(round(len(items) * fraction))
    return list(items[:cut]), list(items[cut:])


# ---------------------------------------------------------------------------------- WordNet

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
    if Path(path).exists():
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            forms = line.split()
            if len(forms) >= 2:
                exceptions[forms[0].lower()].update(f.lower() for f in forms[1:])
    return dict(exceptions)


def read_sense_order(path: Path) -> dict[str, list[int]]:
    """index.POS: lemma -> its synset offsets in WordNet's order (most frequent in SemCor first)."""
    order = {}
    if Path(path).exists():
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
    """Sense-labelled tokens from WordNet's example sentences, and each lemma's sense order.

    For every synset example and every single-word lemma of the synset (of two letters or
    more), the first token whose Morphy base forms include the lemma is an instance of that
    sense. Only lemmas with two or more such senses are kept.
    """
    folder = Path(folder)
    instances, sense_order = [], {}
    for pos, name in POS_FILES.items():
        data = folder / f"data.{name}"
        if not data.exists():
            raise FileNotFoundError(f"WordNet data file {data} not found")
        exceptions = read_exceptions(folder / f"{name}.exc")
        order = read_sense_order(folder / f"index.{name}")
        by_lemma: dict[str, list[SenseInstance]] = defaultdict(list)
        for synset in read_wordnet_data(data):
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


def split_sense_instances(
    instances: Sequence[SenseInstance],
) -> tuple[list[SenseInstance], list[SenseInstance]]:
    """Per sense, in file order, instances 1, 3, 5 ... train and 2, 4, 6 ... test.

    Every test instance thus has a sense seen in training. Only lemmas with two or more trained
    senses (something to disambiguate) and at least one test instance are kept.
    """
    seen: Counter = Counter()
    train, test = [], []
    for instance in instances:
        (train if seen[instance.sense] % 2 == 0 else test).append(instance)
        seen[instance.sense] += 1
    trained = defaultdict(set)
    for instance in train:
        trained[instance.lemma].add(instance.sense)
    test = [i for i in test if len(trained[i.lemma]) >= 2]
    tested = {i.lemma for i in test}
    return [i for i in train if i.lemma in tested], test


# ---------------------------------------------------------------------------------- features


def token_features(bilm, sentences: Sequence[Sequence[str]], batch_size: int = 64):
    """(L + 1, n_tokens, 2P) float32: every token of every sentence, sentences in order."""
    n = sum(len(s) for s in sentences)
    features = None
    start = 0
    chunk = 8 * batch_size  # embed a few batches at a time, not the corpus at once
    for first in range(0, len(sentences), chunk):
        for layers in bilm.embed(sentences[first : first + chunk], batch_size):
            if features is None:
                features = numpy.empty((layers.shape[0], n, layers.shape[2]), numpy.float32)
            features[:, start : start + layers.shape[1]] = layers
            start += layers.shape[1]
    if features is None:
        raise ValueError("no tokens to embed")
    return features


def target_features(bilm, instances: Sequence[SenseInstance], batch_size: int = 64):
    """(L + 1, n_instances, 2P) float32: the target token's vectors, each sentence embedded once."""
    sentences = list(dict.fromkeys(i.words for i in instances))
    index = {words: k for k, words in enumerate(sentences)}
    embedded = bilm.embed([list(s) for s in sentences], batch_size)
    return numpy.stack([embedded[index[i.words]][:, i.target] for i in instances], axis=1)


# ---------------------------------------------------------------------------------- POS probe


@dataclass
class LinearProbe:
    """softmax(W ((x - mean) / scale) + b) over the training tag set."""

    mean: numpy.ndarray
    scale: numpy.ndarray
    weight: numpy.ndarray  # (n_classes, dim)
    bias: numpy.ndarray  # (n_classes,)

    def predict(self, features: numpy.ndarray) -> numpy.ndarray:
        scores = ((features - self.mean) / self.scale) @ self.weight.T + self.bias
        return scores.argmax(axis=1)


def train_linear_probe(
    features: numpy.ndarray,
    labels: numpy.ndarray,
    n_classes: int,
    *,
    l2: float = 1e-4,
    steps: int = 100,
) -> LinearProbe:
    """Multinomial logistic regression on standardised features: full-batch L-BFGS, L2 on W.

    Deterministic: the weights start at zero and every step sees the whole training set.
    """
    x = torch.from_numpy(numpy.ascontiguousarray(features, dtype=numpy.float32))
    mean, scale = x.mean(0), x.std(0).clamp_min(1e-6)
    x = (x - mean) / scale  # (n, dim)
    y = torch.from_numpy(numpy.asarray(labels, dtype=numpy.int64))
    weight = torch.zeros(n_classes, x.shape[1], requires_grad=True)
    bias = torch.zeros(n_classes, requires_grad=True)
    optimizer = torch.optim.LBFGS(
        [weight, bias], lr=1.0, max_iter=steps, history_size=20, line_search_fn="strong_wolfe"
    )

    def closure():
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(x @ weight.T + bias, y)
        loss = loss + l2 * weight.pow(2).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    return LinearProbe(mean.numpy(), scale.numpy(), weight.detach().numpy(), bias.detach().numpy())


def most_frequent_tag_accuracy(
    train: Sequence[TaggedSentence], test: Sequence[TaggedSentence]
) -> float:
    """Accuracy of tagging each word form with its most frequent training tag.

    Unknown words get the most frequent tag overall; ties go to the tag seen first.
    """
    by_word: dict[str, Counter] = defaultdict(Counter)
    overall: Counter = Counter()
    for words, tags in train:
        for word, tag in zip(words, tags):
            by_word[word][tag] += 1
            overall[tag] += 1
    default = overall.most_common(1)[0][0]
    best = {word: counts.most_common(1)[0][0] for word, counts in by_word.items()}
    gold = [(w, t) for words, tags in test for w, t in zip(words, tags)]
    return sum(best.get(w, default) == t for w, t in gold) / len(gold)


def pos_probe(
    bilm,
    train: Sequence[TaggedSentence],
    test: Sequence[TaggedSentence],
    *,
    batch_size: int = 64,
    steps: int = 100,
) -> dict:
    """Per-layer accuracy of a linear tagger on frozen vectors, and the most-frequent-tag one."""
    tagset = sorted({t for _, tags in train for t in tags})
    index = {t: k for k, t in enumerate(tagset)}
    train_y = numpy.array([index[t] for _, tags in train for t in tags])
    test_y = numpy.array([index.get(t, -1) for _, tags in test for t in tags])  # -1: unseen
    train_x = token_features(bilm, [w for w, _ in train], batch_size)
    test_x = token_features(bilm, [w for w, _ in test], batch_size)
    layers = []
    for layer in range(train_x.shape[0]):
        probe = train_linear_probe(train_x[layer], train_y, len(tagset), steps=steps)
        layers.append(float((probe.predict(test_x[layer]) == test_y).mean()))
    return {
        "layers": layers,
        "baseline_most_frequent_tag": most_frequent_tag_accuracy(train, test),
        "n_train_sentences": len(train),
        "n_test_sentences": len(test),
        "n_train_tokens": int(train_y.size),
        "n_test_tokens": int(test_y.size),
        "n_tags": len(tagset),
    }


# ---------------------------------------------------------------------------------- WSD probe


def most_frequent_senses(
    train: Iterable[SenseInstance], sense_order: Optional[dict[str, list[str]]] = None
) -> dict[str, str]:
    """lemma -> its sense with the most training instances.

    Ties go to the sense listed first in `sense_order` (WordNet's), then to the lower offset.
    """
    counts: dict[str, Counter] = defaultdict(Counter)
    for instance in train:
        counts[instance.lemma][instance.sense] += 1
    order = sense_order or {}
    best = {}
    for lemma, senses in counts.items():
        rank = {s: k for k, s in enumerate(order.get(lemma, []))}
        best[lemma] = min(senses, key=lambda s: (-senses[s], rank.get(s, len(rank)), s))
    return best


def nearest_sense_predictions(
    train_x: numpy.ndarray,
    train: Sequence[SenseInstance],
    test_x: numpy.ndarray,
    test: Sequence[SenseInstance],
    fallback: dict[str, str],
) -> list[Optional[str]]:
    """1-NN over sense centroids: the lemma's training sense whose mean vector is nearest (cosine).

    Exact ties (layer 0 gives every token of one word form the same vector) go to the sense seen
    first in training. A lemma without training instances gets `fallback[lemma]` (None when it
    has none either).
    """
    rows: dict[str, list[int]] = defaultdict(list)
    senses_of: dict[str, list[str]] = defaultdict(list)
    for k, instance in enumerate(train):
        if instance.sense not in rows:
            senses_of[instance.lemma].append(instance.sense)
        rows[instance.sense].append(k)
    centroid = {s: train_x[r].mean(0) for s, r in rows.items()}
    predictions: list[Optional[str]] = []
    for vector, instance in zip(test_x, test):
        candidates = senses_of.get(instance.lemma)
        if not candidates:
            predictions.append(fallback.get(instance.lemma))
            continue
        matrix = numpy.stack([centroid[s] for s in candidates])  # (n_senses, dim)
        norms = numpy.linalg.norm(matrix, axis=1) * numpy.linalg.norm(vector)
        cosine = matrix @ vector / numpy.maximum(norms, 1e-12)  # (n_senses,)
        predictions.append(candidates[int(cosine.argmax())])
    return predictions


def wsd_probe(
    bilm,
    train: Sequence[SenseInstance],
    test: Sequence[SenseInstance],
    sense_order: Optional[dict[str, list[str]]] = None,
    *,
    batch_size: int = 64,
) -> dict:
    """Per-layer accuracy of 1-NN sense centroids on frozen vectors, and the MFS baseline."""
    if not test:
        raise ValueError("no WSD test instances: no lemma has two senses with two examples each")
    mfs = most_frequent_senses(train, sense_order)
    trained = defaultdict(set)  # lemma -> its senses with training instances
    for instance in train:
        trained[instance.lemma].add(instance.sense)
    gold = [i.sense for i in test]
    train_x = target_features(bilm, train, batch_size)  # (L + 1, n_train, 2P)
    test_x = target_features(bilm, test, batch_size)
    hits = []  # per layer: whether each test instance got its sense
    for layer in range(train_x.shape[0]):
        predicted = nearest_sense_predictions(train_x[layer], train, test_x[layer], test, mfs)
        hits.append([p == g for p, g in zip(predicted, gold)])
    right = numpy.array(hits)  # (L + 1, n_test)
    mfs_right = numpy.array([mfs.get(i.lemma) == i.sense for i in test])
    pos = numpy.array([i.lemma.rsplit(".", 1)[1] for i in test])
    by_pos = {
        name: {
            "layers": right[:, pos == tag].mean(1).tolist(),
            "baseline_most_frequent_sense": float(mfs_right[pos == tag].mean()),
            "n_test": int((pos == tag).sum()),
        }
        for tag, name in POS_FILES.items()
        if (pos == tag).any()
    }
    return {
        "layers": right.mean(1).tolist(),
        "baseline_most_frequent_sense": float(mfs_right.mean()),
        "baseline_random_sense": float(numpy.mean([1 / len(trained[i.lemma]) for i in test])),
        "n_train": len(train),
        "n_test": len(test),
        "n_lemmas": len({i.lemma for i in test}),
        "by_pos": by_pos,
    }


# ---------------------------------------------------------------------------------- runner


@dataclass
class ProbeSettings:
    tasks: tuple[str, ...] = TASKS
    brown_sentences: int = 5000
    batch_size: int = 64
    steps: int = 100  # L-BFGS iterations of the linear probe
    seed: int = 0
    model: str = "bundled"


def asset_path(assets: Path, task: str) -> Path:
    """Where a task's data lies under the asset folder; FileNotFoundError with the fetch hint."""
    relative, name = ASSETS[task]
    path = Path(assets) / relative
    if not path.exists():
        raise FileNotFoundError(
            f"{path} not found for the {task} probe; fetch it with "
            f"`python -m workflow.fetch_assets {name} --dest {assets}`"
        )
    return path


def parse_tasks(text: str) -> tuple[str, ...]:
    """'pos-wsj,wsd' -> ('pos-wsj', 'wsd'), each checked against TASKS."""
    tasks = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or not tasks:
        raise ValueError(f"--tasks {text!r}: choose from {', '.join(TASKS)}")
    return tasks


def run_probes(bilm, assets: Path, settings: ProbeSettings, log=print) -> dict:
    """Run the chosen probes on the data under `assets`; the result as written to probe.json."""
    paths = {task: asset_path(assets, task) for task in settings.tasks}  # fail before any work
    result: dict = {"model": settings.model, "pos": {}, "notes": {}}
    pos_options = dict(batch_size=settings.batch_size, steps=settings.steps)
    if "pos-wsj" in settings.tasks:
        train, test = split_train_test(read_wsj(paths["pos-wsj"]))
        log(f"pos-wsj: {len(train)} train / {len(test)} test lines")
        result["pos"]["wsj"] = pos_probe(bilm, train, test, **pos_options)
        result["notes"]["pos-wsj"] = "first 80% of the sample's lines train, last 20% test"
    if "pos-brown" in settings.tasks:
        sentences = sample_sentences(
            read_brown(paths["pos-brown"]), settings.brown_sentences, settings.seed
        )
        train, test = split_train_test(sentences)
        log(f"pos-brown: {len(train)} train / {len(test)} test sentences")
        result["pos"]["brown"] = pos_probe(bilm, train, test, **pos_options)
        result["notes"]["pos-brown"] = (
            f"{len(sentences)} sentences sampled with seed {settings.seed}, split 80/20; "
            f"tags reduced to base tags (-tl/-hl/-nc dropped, fw-* -> fw, contraction a+b -> "
            f"a). {BROWN_NOTE}"
        )
    if "wsd" in settings.tasks:
        instances, sense_order = wordnet_instances(paths["wsd"])
        train, test = split_sense_instances(instances)
        log(f"wsd: {len(train)} train / {len(test)} test instances")
        result["wsd"] = wsd_probe(bilm, train, test, sense_order, batch_size=settings.batch_size)
        result["notes"]["wsd"] = (
            "WordNet 3.0 example sentences, target: the first token that is an inflection of a "
            "single-word lemma of the synset; per sense, every second instance (file order) is "
            "held out; lemmas with two or more trained senses. Most frequent sense: most "
            "training instances, ties by WordNet's sense order (its first sense). Random sense: "
            f"{100 * result['wsd']['baseline_random_sense']:.1f}% (a trained sense at random)."
        )
    if result["pos"]:
        result["notes"]["pos"] = (
            "linear softmax on standardised frozen vectors (L-BFGS, L2); baseline: each word "
            "form's most frequent training tag, unknown words the most frequent tag overall"
        )
    else:
        del result["pos"]
    return result


# ---------------------------------------------------------------------------------- report


def _percent(value: Optional[float]) -> str:
    return "" if value is None else f"{100 * value:.1f}"


def markdown_report(result: dict) -> str:
    """probe.md: our accuracy per layer next to the paper's numbers."""
    rows = report_rows(result)
    n_layers = max(len(r["layers"]) for r in rows)
    layer_heads = " | ".join(f"layer {k}" for k in range(n_layers))
    lines = [
        f"# biLM layer probes ({result['model']})",
        "",
        "Accuracy (%) per biLM layer (0: char-CNN token vector, 1 and 2: LSTM layers), next to "
        "the context-free baseline and the numbers of Peters et al. (2018), section 5.3.",
        "",
        f"| probe | {layer_heads} | baseline | test items | paper layer 1 | paper layer 2 |",
        "|" + "---|" * (n_layers + 5),
    ]
    for row in rows:
        cells = [_percent(v) for v in row["layers"]] + [""] * (n_layers - len(row["layers"]))
        paper = PAPER.get(row["paper"], {1: "", 2: ""})
        lines.append(
            f"| {row['name']} | {' | '.join(cells)} | {_percent(row['baseline'])} "
            f"({row['baseline_name']}) | {row['n_test']:,} | {paper[1]} | {paper[2]} |"
        )
    lines += [
        "",
        "The paper's POS numbers are for the full WSJ training set, its WSD numbers all-words F1 "
        "trained on SemCor and tested on Senseval/SemEval; the data here differ (a WSJ sample, "
        "a Brown sample, WordNet's example sentences), so only the ordering of the layers "
        "compares, not the numbers.",
        "",
    ]
    lines += [f"- {task}: {note}" for task, note in result.get("notes", {}).items()]
    return "\n".join(lines) + "\n"


PLURALS = {"noun": "nouns", "verb": "verbs", "adj": "adjectives", "adv": "adverbs"}


def report_rows(result: dict) -> list[dict]:
    """One row per probe of a `run_probes` result: its name, task ("pos" or "wsd") and subset
    (the POS corpus; for WSD None, or the part of speech of the targets), the accuracy per
    layer, the baseline and its name, the number of test items and the PAPER key (or None)."""
    rows = [
        _row(f"POS {corpus}", "pos", corpus, pos, paper="pos")
        for corpus, pos in result.get("pos", {}).items()
    ]
    if "wsd" in result:
        wsd = result["wsd"]
        rows.append(_row("WSD WordNet examples", "wsd", None, wsd, paper="wsd"))
        rows += [
            _row(f"WSD, {PLURALS[tag]} only", "wsd", tag, part, paper=None)
            for tag, part in wsd.get("by_pos", {}).items()
        ]
    return rows


# task -> (its result's baseline key, the baseline's name, its result's test-count key)
_BASELINES = {
    "pos": ("baseline_most_frequent_tag", "most frequent tag", "n_test_tokens"),
    "wsd": ("baseline_most_frequent_sense", "most frequent sense", "n_test"),
}


def _row(name: str, task: str, subset: Optional[str], part: dict, paper: Optional[str]) -> dict:
    baseline, baseline_name, n_test = _BASELINES[task]
    return dict(
        name=name,
        task=task,
        subset=subset,
        layers=part["layers"],
        baseline=part[baseline],
        baseline_name=baseline_name,
        n_test=part[n_test],
        paper=paper,
    )


def plot_report(result: dict, path: Path) -> None:
    """probe.png: POS accuracy per layer (one panel) and WSD (another), baselines dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n_layers = max(len(row["layers"]) for row in report_rows(result))
    figure, (pos_axes, wsd_axes) = plt.subplots(1, 2, figsize=(9, 3.6))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, (name, pos) in enumerate(result.get("pos", {}).items()):
        layers = range(len(pos["layers"]))
        colour = colours[k % len(colours)]
        pos_axes.plot(layers, [100 * a for a in pos["layers"]], "o-", color=colour, label=name)
        pos_axes.axhline(
            100 * pos["baseline_most_frequent_tag"],
            linestyle="--",
            color=colour,
            label=f"{name} most frequent tag",
        )
    if "wsd" in result:
        wsd = result["wsd"]
        layers = range(len(wsd["layers"]))
        wsd_axes.plot(layers, [100 * a for a in wsd["layers"]], "o-", label="1-NN sense centroid")
        wsd_axes.axhline(
            100 * wsd["baseline_most_frequent_sense"], linestyle="--", label="most frequent sense"
        )
        wsd_axes.axhline(
            100 * wsd["baseline_random_sense"], linestyle=":", color="grey", label="random sense"
        )
    for axes, title in ((pos_axes, "POS tagging (linear probe)"), (wsd_axes, "WSD (1-NN)")):
        axes.set_title(title)
        axes.set_xlabel("biLM layer")
        axes.set_ylabel("accuracy (%)")
        axes.set_xticks(range(n_layers))
        if axes.has_data():
            axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def write_report(result: dict, output: Path) -> list[Path]:
    """probe.json, probe.md and (when matplotlib is installed) probe.png under `output`."""
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    written = [output / "probe.json", output / "probe.md"]
    written[0].write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    written[1].write_text(markdown_report(result), encoding="utf-8")
    try:
        plot_report(result, output / "probe.png")
    except ImportError:
        import warnings

        warnings.warn("matplotlib is not installed: no probe.png", stacklevel=2)
    else:
        written.append(output / "probe.png")
    return written
