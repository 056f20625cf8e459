"""The frozen-layer cache in training, and `nlp.pipe` of elmo + tagger + ner vs tagger + ner.

Run with the project venv, from the repository root:

    .venv/bin/python -m benchmarks.bench_layer_cache            # about 5-10 min on 2 cores
    .venv/bin/python -m benchmarks.bench_layer_cache --quick    # smoke run

Pipelines: configs/ner_tagger_elmo.cfg (elmo + tagger + ner, listeners) and
configs/ner_tagger_baseline.cfg (tagger + ner, no ELMo), built with
`spacy.util.load_model_from_config` and `nlp.initialize` on the first --init-sentences (at
least --train-sentences) CoNLL-2003 train sentences (gold tokens, one Example per sentence as
with `gold_preproc`). The elmo
component uses the bundled biLM (spacy_elmo/data/en_elmo_bundled) when it is installed, else a
random biLM of the bundled shape saved to the cache folder and loaded through
`[initialize.components.elmo.weights]` @misc = "spacy_elmo.SavedBiLM.v1" (speed does not depend
on the weights' values).

Measures, with `torch.set_num_threads(--threads)`:
* `nlp.pipe` words/s on the first --pipe-sentences CoNLL-2003 valid sentences, one Doc per
  sentence (gold tokens), batch_size from the config (256), n_process=1; one untimed warm-up.
* the time of training epochs 1 and 2 (`nlp.update` over the same --train-sentences train
  sentences in fixed minibatches of --batch-size sentences): with a frozen biLM the layers of
  every sentence are computed in epoch 1 and come from the cache in epoch 2, so epoch 2 must
  not run the biLM: the tokens that reach the biLM (a torch forward hook counts them) are
  printed after each epoch.

Writes benchmarks/results/layer_cache_cpu.{md,json} (layer_cache_cpu_quick.* with --quick).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from benchmarks.common import conll_sentences, machine_info, write_results

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
CONFIGS = {
    "elmo": REPO / "configs" / "ner_tagger_elmo.cfg",
    "baseline": REPO / "configs" / "ner_tagger_baseline.cfg",
}


def elmo_weights(cache_dir: Path) -> tuple[str | None, str]:
    """(path for SavedBiLM.v1 or None for the bundled model, description)."""
    from spacy_elmo.pipeline.loaders import BUNDLED_MODEL

    if (BUNDLED_MODEL / "model.safetensors").exists():
        return None, f"bundled biLM ({BUNDLED_MODEL.relative_to(REPO)})"
    import torch

    from spacy_elmo import BiLM, BiLMOptions
    from spacy_elmo.pretrain.presets import preset

    folder = cache_dir / "bundled_shape_random"
    if not (folder / "model.safetensors").exists():
        torch.manual_seed(0)
        BiLM(BiLMOptions.from_dict(preset("bundled"))).save(folder)
    return str(folder), "random biLM of the bundled shape (no bundled model installed)"


def build(name: str, weights_path: str | None):
    from spacy.util import load_config, load_model_from_config

    config = load_config(CONFIGS[name], overrides={"paths.train": None, "paths.dev": None})
    if name == "elmo" and weights_path is not None:
        config["initialize"]["components"]["elmo"] = {
            "weights": {"@misc": "spacy_elmo.SavedBiLM.v1", "path": weights_path}
        }
    return load_model_from_config(config, auto_fill=True, validate=True)


BILM_TOKENS = [0]  # tokens that reached a biLM's forward pass so far (`count_bilm_tokens`)


def count_bilm_tokens(module, args, output) -> None:
    """A forward hook on every torch module: adds up the tokens of each biLM output."""
    from spacy_elmo import BiLM

    if isinstance(module, BiLM):
        BILM_TOKENS[0] += int(output.mask.sum())


def bilm_tokens(nlp) -> int | None:
    if "elmo" not in nlp.pipe_names:
        return None
    return BILM_TOKENS[0]


def bench_pipe(nlp, make_docs, n_words: int) -> dict:
    list(nlp.pipe(make_docs()[:64]))  # warm-up
    docs = make_docs()
    start = time.perf_counter()
    for _ in nlp.pipe(docs):
        pass
    elapsed = time.perf_counter() - start
    return {"pipe_seconds": elapsed, "pipe_words": n_words, "pipe_words_per_s": n_words / elapsed}


def bench_epochs(nlp, examples, batch_size: int, n_epochs: int) -> list[dict]:
    from spacy.util import minibatch

    optimizer = nlp.create_optimizer()
    batches = list(minibatch(examples, size=batch_size))
    epochs = []
    for epoch in range(1, n_epochs + 1):
        losses: dict = {}
        start = time.perf_counter()
        for batch in batches:
            nlp.update(batch, sgd=optimizer, drop=0.1, losses=losses)
        elapsed = time.perf_counter() - start
        record = {
            "epoch": epoch,
            "seconds": elapsed,
            "bilm_tokens": bilm_tokens(nlp),
            "losses": {k: round(float(v), 3) for k, v in losses.items()},
        }
        print(
            f"  epoch {epoch}: {elapsed:.1f} s, bilm_tokens = {record['bilm_tokens']}, "
            f"losses {record['losses']}",
            flush=True,
        )
        epochs.append(record)
    return epochs


def markdown(report: dict) -> str:
    m, s, r = report["machine"], report["settings"], report["results"]
    lines = [
        "# spaCy pipeline benchmark: elmo + tagger + ner vs tagger + ner (CPU)",
        "",
        f"- Machine: {m['cpu']}, {m['cpu_cores']} cores; {s['threads']} torch threads",
        f"- Versions: Python {m['python']}, torch {m['torch']}, spaCy {m['spacy']}, thinc "
        f"{m['thinc']}, spacy-elmo git {m.get('git_commit', '?')}",
        f"- Date: {m['date']}",
        f"- biLM: {s['elmo_weights']}",
        f"- Command: `{s['command']}`",
        "",
        f"`nlp.pipe` on the first {s['pipe_sentences']:,} CoNLL-2003 valid sentences "
        f"({r['baseline']['pipe_words']:,} words, one Doc per sentence, gold tokens):",
        "",
        "| pipeline | words/s | seconds | relative |",
        "|---|---:|---:|---:|",
    ]
    base = r["baseline"]["pipe_words_per_s"]
    for name, label in (("baseline", "tagger + ner"), ("elmo", "elmo + tagger + ner")):
        x = r[name]
        lines.append(
            f"| {label} | {x['pipe_words_per_s']:,.0f} | {x['pipe_seconds']:.1f} "
            f"| {x['pipe_words_per_s'] / base:.2f}x |"
        )
    lines += [
        "",
        f"Training (`nlp.update`, dropout 0.1, minibatches of {s['batch_size']} sentences) over "
        f"the same {s['train_sentences']} CoNLL-2003 train sentences "
        f"({r['train_words']:,} words); initialised on {s['init_sentences']} sentences:",
        "",
        "| pipeline | epoch | seconds | epoch / epoch 1 | biLM tokens after the epoch |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, label in (("baseline", "tagger + ner"), ("elmo", "elmo + tagger + ner")):
        epochs = r[name]["epochs"]
        for e in epochs:
            tokens = "–" if e["bilm_tokens"] is None else f"{e['bilm_tokens']:,}"
            lines.append(
                f"| {label} | {e['epoch']} | {e['seconds']:.1f} "
                f"| {e['seconds'] / epochs[0]['seconds']:.2f} | {tokens} |"
            )
    elmo = r["elmo"]
    epoch2 = elmo.get("epoch2_bilm_tokens")
    if epoch2 is not None:
        verdict = "all layers from the frozen-layer cache" if epoch2 == 0 else "NOT all cached"
        lines += [
            "",
            f"biLM tokens after `nlp.initialize`: {elmo['bilm_tokens_after_init']:,}; epoch 1 "
            f"ran the biLM on {elmo['epoch1_bilm_tokens']:,} tokens (repeated sentences come "
            f"from the cache already in epoch 1), epoch 2 on {epoch2:,} ({verdict}). "
            "The counter (a forward hook on the biLM) also "
            "counts the `nlp.pipe` run before training.",
        ]
    lines.append("")
    return "\n".join(lines)


def make_examples(sentences, vocab) -> list:
    """One Example per sentence (as `gold_preproc`): gold tokens, tags and entities."""
    from spacy.tokens import Doc
    from spacy.training import Example

    from workflow.convert_conll import make_doc

    result = []
    for sentence in sentences:
        gold = make_doc(vocab, [sentence])
        words = [t.text for t in gold]
        spaces = [bool(t.whitespace_) for t in gold]
        result.append(Example(Doc(vocab, words=words, spaces=spaces), gold))
    return result


def run_pipeline(name: str, args, train, valid, weights_path: str | None) -> dict:
    from spacy.tokens import Doc

    print(f"[{name}] building and initialising ...", flush=True)
    start = time.perf_counter()
    nlp = build(name, weights_path)
    # Every label of the training sentences must be known: initialise on all of them too.
    n_init = max(args.init_sentences, args.train_sentences)
    init_examples = make_examples(train[:n_init], nlp.vocab)
    nlp.initialize(lambda: init_examples)
    result = {"init_seconds": time.perf_counter() - start}
    result["bilm_tokens_after_init"] = bilm_tokens(nlp)
    train_examples = make_examples(train[: args.train_sentences], nlp.vocab)

    def make_docs():
        return [
            Doc(nlp.vocab, words=words, spaces=[True] * (len(words) - 1) + [False])
            for words in ([t.word for t in s] for s in valid)
        ]

    print(f"[{name}] nlp.pipe on {len(valid)} sentences ...", flush=True)
    result.update(bench_pipe(nlp, make_docs, sum(len(s) for s in valid)))
    print(f"[{name}] {result['pipe_words_per_s']:,.0f} words/s", flush=True)
    print(f"[{name}] {args.epochs} epochs on {args.train_sentences} sentences ...", flush=True)
    before = bilm_tokens(nlp)
    epochs = bench_epochs(nlp, train_examples, args.batch_size, args.epochs)
    result["epochs"] = epochs
    if name == "elmo":
        result["bilm_tokens_before_epoch1"] = before
        result["epoch1_bilm_tokens"] = epochs[0]["bilm_tokens"] - before
        if len(epochs) > 1:
            result["epoch2_bilm_tokens"] = epochs[1]["bilm_tokens"] - epochs[0]["bilm_tokens"]
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--pipe-sentences", type=int, default=0, help="valid sentences for nlp.pipe (0: all)"
    )
    parser.add_argument("--train-sentences", type=int, default=500)
    parser.add_argument(
        "--init-sentences", type=int, default=500, help="at least --train-sentences"
    )
    parser.add_argument("--batch-size", type=int, default=32, help="sentences per update")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(__file__).resolve().parent.parent.parent / "bench-cache",
    )
    parser.add_argument("--output", type=Path, default=None, help="results path without suffix")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.pipe_sentences, args.train_sentences, args.init_sentences = 100, 64, 64
    name = "layer_cache_cpu" + ("_quick" if args.quick else "")
    output = args.output or HERE / "results" / name
    output.parent.mkdir(parents=True, exist_ok=True)
    args.cache_dir.mkdir(parents=True, exist_ok=True)

    import torch

    torch.set_num_threads(args.threads)
    torch.nn.modules.module.register_module_forward_hook(count_bilm_tokens)
    import spacy_elmo  # noqa: F401  (registers the factories and architectures)

    weights_path, weights_desc = elmo_weights(args.cache_dir)
    n_train = max(args.train_sentences, args.init_sentences)
    train = conll_sentences("train", n_train)
    valid = conll_sentences("valid", args.pipe_sentences or None)
    train_words = sum(len(s) for s in train[: args.train_sentences])

    report: dict = {
        "machine": machine_info("spacy", "thinc"),
        "settings": {
            "threads": args.threads,
            "pipe_sentences": len(valid),
            "train_sentences": args.train_sentences,
            "init_sentences": max(args.init_sentences, args.train_sentences),
            "batch_size": args.batch_size,
            "epochs": args.epochs,
            "elmo_weights": weights_desc,
            "command": (
                "python -m benchmarks.bench_layer_cache "
                + " ".join(argv if argv is not None else sys.argv[1:])
            ).strip(),
        },
        "results": {"train_words": train_words},
    }
    for name in ("baseline", "elmo"):
        report["results"][name] = run_pipeline(name, args, train, valid, weights_path)

    text = markdown(report)
    write_results(output, report, text)
    print()
    print(text)
    print(f"wrote {output.with_suffix('.md')} and {output.with_suffix('.json')}")
    if report["results"]["elmo"].get("epoch2_bilm_tokens"):
        raise SystemExit("epoch 2 ran the biLM: the frozen-layer cache did not serve it")


if __name__ == "__main__":
    main()
