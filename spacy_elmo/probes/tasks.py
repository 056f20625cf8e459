"""The two probes on frozen biLM vectors, per layer: (a) a linear softmax POS tagger next to the
most-frequent-tag baseline, and (b) 1-nearest-neighbour word sense disambiguation over sense
centroids (Melamud et al. 2016) next to the most-frequent-sense baseline."""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy
import torch

from .data import (
    POS_FILES,
    SenseInstance,
    TaggedSentence,
    read_brown,
    read_tagged_lines,
    sense_counts,
    split_sense_instances,
    wordnet_instances,
)


def token_features(bilm, sentences: Sequence[Sequence[str]], batch_size: int):
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


def target_features(bilm, instances: Sequence[SenseInstance], batch_size: int):
    """(L + 1, n_instances, 2P) float32: the target token's vectors, each sentence embedded once."""
    sentences = list(dict.fromkeys(i.words for i in instances))
    index = {words: k for k, words in enumerate(sentences)}
    embedded = bilm.embed([list(s) for s in sentences], batch_size)
    return numpy.stack([embedded[index[i.words]][:, i.target] for i in instances], axis=1)


def train_linear_probe(
    features: numpy.ndarray, labels: numpy.ndarray, n_classes: int
) -> Callable[[numpy.ndarray], numpy.ndarray]:
    """Multinomial logistic regression on standardised features by full-batch L-BFGS (100
    iterations), L2 (1e-4) on W, from zero weights (deterministic): its prediction, argmax
    W ((x - mean) / scale) + b."""
    x = torch.from_numpy(numpy.ascontiguousarray(features, dtype=numpy.float32))
    mean, scale = x.mean(0), x.std(0).clamp_min(1e-6)
    x = (x - mean) / scale  # (n, dim)
    y = torch.from_numpy(numpy.asarray(labels, dtype=numpy.int64))
    weight = torch.zeros(n_classes, x.shape[1], requires_grad=True)
    bias = torch.zeros(n_classes, requires_grad=True)
    optimizer = torch.optim.LBFGS(
        [weight, bias], lr=1.0, max_iter=100, history_size=20, line_search_fn="strong_wolfe"
    )

    def closure():
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(x @ weight.T + bias, y)
        loss = loss + 1e-4 * weight.pow(2).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    mean, scale = mean.numpy(), scale.numpy()
    weight, bias = weight.detach().numpy(), bias.detach().numpy()  # (n_classes, dim), (n_classes,)

    def predict(features: numpy.ndarray) -> numpy.ndarray:
        return (((features - mean) / scale) @ weight.T + bias).argmax(axis=1)

    return predict


def most_frequent_tag_accuracy(
    train: Sequence[TaggedSentence], test: Sequence[TaggedSentence]
) -> float:
    """Accuracy of tagging each word form with its most frequent training tag (unknown words:
    the most frequent tag overall; ties: the tag seen first)."""
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
    bilm, train: Sequence[TaggedSentence], test: Sequence[TaggedSentence], batch_size: int
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
        predict = train_linear_probe(train_x[layer], train_y, len(tagset))
        layers.append(float((predict(test_x[layer]) == test_y).mean()))
    return {
        "layers": layers,
        "baseline_most_frequent_tag": most_frequent_tag_accuracy(train, test),
        "n_train_sentences": len(train),
        "n_test_sentences": len(test),
        "n_train_tokens": int(train_y.size),
        "n_test_tokens": int(test_y.size),
        "n_tags": len(tagset),
    }


def most_frequent_senses(
    train: Iterable[SenseInstance], sense_order: dict[str, list[str]]
) -> dict[str, str]:
    """lemma -> its sense with the most training instances (ties: the first in `sense_order`,
    which lists every sense of a lemma: `wordnet_instances`')."""
    counts: dict[str, Counter] = defaultdict(Counter)
    for instance in train:
        counts[instance.lemma][instance.sense] += 1
    return {
        lemma: min(senses, key=lambda s: (-senses[s], sense_order[lemma].index(s)))
        for lemma, senses in counts.items()
    }


def nearest_sense_predictions(
    train_x: numpy.ndarray,
    train: Sequence[SenseInstance],
    test_x: numpy.ndarray,
    test: Sequence[SenseInstance],
) -> list[str]:
    """The lemma's training sense whose centroid is nearest (cosine; every test lemma has
    training senses: `split_sense_instances`); in float64, so that exact ties stay exact and go
    to the sense seen first."""
    rows: dict[str, list[int]] = defaultdict(list)
    senses_of: dict[str, list[str]] = defaultdict(list)
    for k, instance in enumerate(train):
        if instance.sense not in rows:
            senses_of[instance.lemma].append(instance.sense)
        rows[instance.sense].append(k)
    centroid = {s: train_x[r].astype(numpy.float64).mean(0) for s, r in rows.items()}
    predictions = []
    for vector, instance in zip(test_x, test):
        candidates = senses_of[instance.lemma]
        matrix = numpy.stack([centroid[s] for s in candidates])  # (n_senses, dim)
        vector = vector.astype(numpy.float64)
        norms = numpy.linalg.norm(matrix, axis=1) * numpy.linalg.norm(vector)
        cosine = matrix @ vector / numpy.maximum(norms, 1e-12)  # (n_senses,)
        predictions.append(candidates[int(cosine.argmax())])
    return predictions


def wsd_probe(
    bilm,
    train: Sequence[SenseInstance],
    test: Sequence[SenseInstance],
    sense_order: dict[str, list[str]],
    batch_size: int,
) -> dict:
    """Per-layer accuracy of 1-NN sense centroids on frozen vectors, and the MFS baseline."""
    if not test:
        raise ValueError("no WSD test instances: no lemma has two senses with two examples each")
    mfs = most_frequent_senses(train, sense_order)
    n_senses = sense_counts(train)
    gold = [i.sense for i in test]
    train_x = target_features(bilm, train, batch_size)  # (L + 1, n_train, 2P)
    test_x = target_features(bilm, test, batch_size)
    hits = []  # per layer: whether each test instance got its sense
    for layer in range(train_x.shape[0]):
        predicted = nearest_sense_predictions(train_x[layer], train, test_x[layer], test)
        hits.append([p == g for p, g in zip(predicted, gold)])
    right = numpy.array(hits)  # (L + 1, n_test)
    mfs_right = numpy.array([mfs[i.lemma] == i.sense for i in test])
    pos = numpy.array([i.lemma.rsplit(".", 1)[1] for i in test])

    def scores(chosen: numpy.ndarray) -> dict:
        """Accuracy per layer and of the MFS baseline on the chosen test instances."""
        return {
            "layers": right[:, chosen].mean(1).tolist(),
            "baseline_most_frequent_sense": float(mfs_right[chosen].mean()),
            "n_test": int(chosen.sum()),
        }

    return {
        **scores(numpy.ones(len(test), dtype=bool)),
        "baseline_random_sense": float(numpy.mean([1 / n_senses[i.lemma] for i in test])),
        "n_train": len(train),
        "n_lemmas": len({i.lemma for i in test}),
        "by_pos": {name: scores(pos == tag) for tag, name in POS_FILES.items() if tag in pos},
    }


def run_probes(
    bilm, paths: dict[str, Path], model: str, brown_sentences: int, batch_size: int, seed: int, log
) -> dict:
    """Run the probes of `paths` (`check_assets`'s: task -> its data) on `bilm`, named `model`
    in the report; the result as written to probe.json."""
    result: dict = {"model": model, "pos": {}, "notes": {}}
    tagged = {}  # corpus -> its lines, the first 80% train, the rest test
    if "pos-wsj" in paths:
        tagged["wsj"] = read_tagged_lines(paths["pos-wsj"])
        result["notes"]["pos-wsj"] = "first 80% of the sample's lines train, last 20% test"
    if "pos-brown" in paths:
        brown = read_brown(paths["pos-brown"])
        tagged["brown"] = random.Random(seed).sample(brown, min(brown_sentences, len(brown)))
        result["notes"]["pos-brown"] = (
            f"{len(tagged['brown'])} sentences sampled with seed {seed}, split 80/20; "
            "tags reduced to base tags (-tl/-hl/-nc dropped, fw-* -> fw, contraction a+b -> a). "
            "Brown is part of the bundled biLM's pretraining text (tags stripped): the Brown "
            "probe tests on sentences the biLM has read."
        )
    for corpus, sentences in tagged.items():
        cut = round(len(sentences) * 0.8)
        train, test = sentences[:cut], sentences[cut:]
        log(f"pos-{corpus}: {len(train)} train / {len(test)} test lines")
        result["pos"][corpus] = pos_probe(bilm, train, test, batch_size=batch_size)
    if "wsd" in paths:
        instances, sense_order = wordnet_instances(paths["wsd"])
        train, test = split_sense_instances(instances)
        log(f"wsd: {len(train)} train / {len(test)} test instances")
        result["wsd"] = wsd_probe(bilm, train, test, sense_order, batch_size=batch_size)
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
