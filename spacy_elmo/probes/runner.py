"""Run the chosen probes on the data of an asset folder: the result that probe.json holds."""

from __future__ import annotations

import random
from pathlib import Path

from .data import TASKS, read_brown, read_tagged_lines, split_train_test
from .tasks import pos_probe, wsd_probe
from .wordnet import split_sense_instances, wordnet_instances


def parse_tasks(text: str) -> tuple[str, ...]:
    """'pos-wsj,wsd' -> ('pos-wsj', 'wsd'), each checked against TASKS."""
    tasks = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or not tasks:
        raise ValueError(f"probe tasks {text!r}: choose from {', '.join(TASKS)}")
    return tasks


def run_probes(
    bilm, paths: dict[str, Path], model: str, brown_sentences: int, batch_size: int, seed: int, log
) -> dict:
    """Run the probes of `paths` (`check_assets`'s: task -> its data) on `bilm`, named `model`
    in the report; the result as written to probe.json."""
    result: dict = {"model": model, "pos": {}, "notes": {}}
    if "pos-wsj" in paths:
        train, test = split_train_test(read_tagged_lines(paths["pos-wsj"]))
        log(f"pos-wsj: {len(train)} train / {len(test)} test lines")
        result["pos"]["wsj"] = pos_probe(bilm, train, test, batch_size=batch_size)
        result["notes"]["pos-wsj"] = "first 80% of the sample's lines train, last 20% test"
    if "pos-brown" in paths:
        brown = read_brown(paths["pos-brown"])
        sentences = random.Random(seed).sample(brown, min(brown_sentences, len(brown)))
        train, test = split_train_test(sentences)
        log(f"pos-brown: {len(train)} train / {len(test)} test sentences")
        result["pos"]["brown"] = pos_probe(bilm, train, test, batch_size=batch_size)
        result["notes"]["pos-brown"] = (
            f"{len(sentences)} sentences sampled with seed {seed}, split 80/20; "
            "tags reduced to base tags (-tl/-hl/-nc dropped, fw-* -> fw, contraction a+b -> a). "
            "Brown is part of the bundled biLM's pretraining text (tags stripped): the Brown "
            "probe tests on sentences the biLM has read."
        )
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
