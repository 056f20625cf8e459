"""Run-time cost of the five learning-curve pipelines on CPU, side by side in one run.

The pipelines are the trained ones of docs/learning-curves.md (tagger + NER on hash features,
static vectors, the bundled ELMo, both, and the fine-tuned all-MiniLM-L6-v2 transformer): by
default each one's `model-best` of the evidence run at --size sentences and --seed
(`training/evidence/{pipeline}_{size}_s{seed}/model-best`, made by `spacy project run evidence`
and `evidence-transformer`); `--model NAME=PATH` names another. The training size does not
change a pipeline's architecture, so its speed is the same at every size.

Each pipeline runs in its own fresh process (so that its peak memory is its own), with torch,
OpenMP and BLAS on --threads threads, in --rounds rounds that alternate the order, on the
CoNLL-2003 test text with its gold tokens:

* batch: `nlp.pipe` over the 3,453 test sentences, one Doc each (as the test scores were
  made), the pipeline's own batch size, --passes times in each round (fresh Docs each time);
  words/s, the fastest pass of the fastest round (a fresh process's first pass runs 5-10%
  slower than the next);
* single-sentence latency: `nlp(doc)` on each of the first --latency-sentences sentences alone,
  the biLM's token cache emptied first (the batch passes filled it with every test word);
* single-document latency: `nlp(doc)` on each of the 231 test documents alone (all its sentences
  in one Doc, sentence starts from the data);
* batch time by component: the same batch once more, one component at a time over all
  the docs, in microseconds a word;
* load time (`spacy.load`), resident memory before loading (Python, spaCy, torch imported) and
  the peak over the process (`ru_maxrss`).

Then the plot of test NER F1 (results/evidence.json, mean over seeds) against batch words/s, one
point per pipeline and training size (docs/f1_vs_speed.png). Usage:

    python -m benchmarks.bench_pipeline                      # about 7 minutes on 2 cores
    python -m benchmarks.bench_pipeline --plot-only          # F1 column and plot, from the JSONs
    python -m benchmarks.bench_pipeline --bf16 --pipelines elmo --quick   # bf16 beside float32

With --bf16, every pipeline with an `elmo` component is measured once more, in the same
rounds, as "NAME bf16": loaded with `components.elmo.quantize = "bf16"` (the biLM's LSTM
products in bfloat16, `spacy_elmo/bilm/quantize.py`). With --in-turn, each of
them once more as "NAME in turn" (and "NAME bf16 in turn"): loaded with
`components.elmo.overlap = false`, the biLM run in turn with the other components
instead of one batch ahead in a background thread (the default,
`spacy_elmo/pipeline/overlap.py`).

Needs the `transformer` extra for the transformer pipeline (a pipeline whose model is missing
is reported as not measured, with the command that trains it).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import CONLL, machine_info, shown_path, write_results
from workflow.evidence.colours import PIPELINE_COLOURS

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PIPELINES = ("baseline", "vectors", "elmo", "vectors+elmo", "transformer")
EVIDENCE = REPO / "results" / "evidence.json"
PLOT = REPO / "docs" / "f1_vs_speed.png"
OUTPUT = HERE / "results" / "pipeline_cpu"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pipelines", nargs="+", default=list(PIPELINES), choices=PIPELINES)
    parser.add_argument("--runs", type=Path, default=REPO / "training" / "evidence")
    parser.add_argument("--size", default="1000", help="evidence run size (1000, 3000, all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--model", action="append", default=[], metavar="NAME=PATH", help="a pipeline's model"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--passes", type=int, default=3, help="batch passes in each round (the fastest counts)"
    )
    parser.add_argument("--latency-sentences", type=int, default=500)
    parser.add_argument("--test", type=Path, default=CONLL / "test.txt")
    parser.add_argument("--evidence", type=Path, default=EVIDENCE)
    parser.add_argument("--output", type=Path, default=OUTPUT, help="results path, no suffix")
    parser.add_argument("--plot", type=Path, default=PLOT)
    parser.add_argument(
        "--plot-only",
        action="store_true",
        help="no measuring: the Markdown and the plot again, from --output's JSON and --evidence",
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 300 sentences, 20 alone, 10 documents"
    )
    parser.add_argument("--documents", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--batch-sentences", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument(
        "--bf16", action="store_true", help="also each elmo pipeline with quantize = bf16"
    )
    parser.add_argument("--child", nargs=2, metavar=("NAME", "PATH"), help=argparse.SUPPRESS)
    parser.add_argument(
        "--in-turn", action="store_true", help="also each elmo pipeline with overlap = false"
    )
    parser.add_argument("--child-overrides", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.child[1], args)), flush=True)
        return
    if args.quick:
        args.batch_sentences, args.latency_sentences, args.documents = 300, 20, 10
        args.rounds, args.passes = 1, 1
        args.output = args.output.with_name(args.output.name + "_quick")
        args.plot = args.output.with_suffix(".png")
    if args.plot_only:
        report = json.loads(args.output.with_suffix(".json").read_text())
        f1 = load_f1(args.evidence)
        args.output.with_suffix(".md").write_text(markdown(report, f1))
        plot(report, f1, args.plot)
        print(f"wrote {args.output}.md (its F1 column) and {args.plot}")
        return

    run = f"{args.size}_s{args.seed}"
    models = {name: args.runs / f"{name}_{run}" / "model-best" for name in PIPELINES}
    for item in args.model:
        name, sep, path = item.partition("=")
        if not sep or name not in PIPELINES:
            names = ", ".join(PIPELINES)
            parser.error(f"--model takes NAME=PATH with NAME one of {names}: {item!r}")
        models[name] = Path(path)
    report: dict = {
        "machine": machine_info("spacy", "thinc", "spacy-transformers", "transformers"),
        "settings": {
            "threads": args.threads,
            "rounds": args.rounds,
            "passes": args.passes,
            "latency_sentences": args.latency_sentences,
            "latency_token_cache": "emptied",
            "models": {name: shown_path(models[name]) for name in args.pipelines},
            "command": "python -m benchmarks.bench_pipeline "
            + " ".join(argv if argv is not None else sys.argv[1:]),
        },
        "rounds": [],
        "missing": {},
    }
    present = []
    for name in args.pipelines:
        if (models[name] / "config.cfg").exists():
            present.append(name)
        else:
            report["missing"][name] = (
                f"no trained pipeline at {shown_path(models[name])}: `python -m workflow.evidence "
                f"run --pipeline {name} --size {args.size} --seed {args.seed}` trains it"
            )
            print(f"[{name}] not measured: {report['missing'][name]}", flush=True)
    # (label, pipeline, config overrides): with --bf16, each elmo pipeline again as
    # "NAME bf16"; with --in-turn, each elmo variant again as "... in turn"
    runs = [(name, name, {}) for name in present]
    with_elmo = [run for run in runs if "elmo" in run[1]]
    plain_elmo = list(with_elmo)
    for mode in ("bf16",):
        if getattr(args, mode):
            quantize = {"components.elmo.quantize": mode}
            with_elmo += [(f"{name} {mode}", name, quantize) for name, _, _ in plain_elmo]
            report["settings"][mode] = [f"{name} {mode}" for name, _, _ in plain_elmo]
    if args.in_turn:
        in_turn = [
            (f"{label} in turn", name, {**config, "components.elmo.overlap": False})
            for label, name, config in with_elmo
        ]
        report["settings"]["in_turn"] = [label for label, _, _ in in_turn]
    if args.in_turn:
        with_elmo += in_turn
    runs += [run for run in with_elmo if run[2]]
    labels = [label for label, _, _ in runs]
    for number in range(args.rounds):
        order = runs if number % 2 == 0 else runs[::-1]
        results = {}
        for name, pipeline, overrides in order:
            print(f"[round {number + 1}] {name} ...", flush=True)
            results[name] = run_child(pipeline, models[pipeline], args, overrides)
            r = results[name]
            print(
                f"[round {number + 1}] {name}: {r['batch_words_per_s']:,.0f} words/s, sentence "
                f"{r['sentence_ms']['median']:.1f} ms, document {r['document_ms']['median']:.0f} "
                f"ms, peak {r['peak_rss_mb']:,.0f} MB",
                flush=True,
            )
        report["rounds"].append({"order": [label for label, _, _ in order], "results": results})
    report["summary"] = summarise(report["rounds"], labels)
    f1 = load_f1(args.evidence)
    text = markdown(report, f1)
    write_results(args.output, report, text)
    plot(report, f1, args.plot)
    print()
    print(text)
    print(f"wrote {args.output}.md, {args.output}.json, {args.plot}")


def run_child(name: str, model: Path, args, overrides: dict | None = None) -> dict:
    """One pipeline measured in a fresh process with `threads` threads everywhere, loaded with
    the config `overrides` (e.g. {"components.elmo.quantize": "bf16"})."""
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "RAYON_NUM_THREADS"):
        env[var] = str(args.threads)
    env.update(TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    command = [sys.executable, "-m", "benchmarks.bench_pipeline", "--child", name, str(model)]
    command += ["--threads", str(args.threads), "--test", str(args.test)]
    command += ["--latency-sentences", str(args.latency_sentences), "--passes", str(args.passes)]
    command += ["--documents", str(args.documents), "--batch-sentences", str(args.batch_sentences)]
    command += ["--child-overrides", json.dumps(overrides or {})]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"[{name}] the measuring process failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def rss_mb(pid: int | str = "self", field: str = "VmRSS") -> float:
    """A process's resident memory now (VmRSS) or at its peak (VmHWM), in MB."""
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def test_documents(path: Path) -> list[list[list[str]]]:
    """The CoNLL-2003 test documents: lists of sentences of words (gold tokens)."""
    from workflow.conll import read_conll

    with open(path, encoding="utf-8") as lines:
        return [[[t.word for t in s] for s in doc] for doc in read_conll(lines, str(path))]


def measure(model: str, args) -> dict:
    """Load one pipeline and time it (runs in the child process)."""
    import torch

    torch.set_num_threads(args.threads)
    import spacy
    from spacy.tokens import Doc

    import spacy_elmo  # noqa: F401  (the elmo factory and layers)
    from spacy_elmo.layers.elmo_model import get_bilm

    documents = test_documents(args.test)
    sentences = [s for doc in documents for s in doc][: args.batch_sentences or None]
    documents = documents[: args.documents or None]
    rss_before = rss_mb()
    start = time.perf_counter()
    overrides = json.loads(args.child_overrides)
    nlp = spacy.load(model, config=overrides)
    load_seconds = time.perf_counter() - start
    rss_loaded = rss_mb()

    def sentence_doc(words):
        return Doc(nlp.vocab, words=words, spaces=[True] * (len(words) - 1) + [False])

    def document_doc(doc_sentences):
        words = [w for s in doc_sentences for w in s]
        starts = [i == 0 for s in doc_sentences for i in range(len(s))]
        return Doc(nlp.vocab, words=words, spaces=[True] * len(words), sent_starts=starts)

    list(nlp.pipe([sentence_doc(s) for s in sentences[:64]]))  # warm-up
    nlp(document_doc(documents[0]))
    n_words = sum(len(s) for s in sentences)
    pass_seconds = []
    for _ in range(args.passes):
        docs = [sentence_doc(s) for s in sentences]
        start = time.perf_counter()
        for _ in nlp.pipe(docs):
            pass
        pass_seconds.append(time.perf_counter() - start)
    batch_seconds = min(pass_seconds)
    # The same batch once more, one component at a time over all its docs (the pipeline's
    # batch size): where the batch time goes.
    docs = [sentence_doc(s) for s in sentences]
    component_seconds = {}
    for name, component in nlp.pipeline:
        start = time.perf_counter()
        docs = list(component.pipe(docs, batch_size=nlp.batch_size))
        component_seconds[name] = time.perf_counter() - start

    def latencies(make, items) -> list[float]:
        times = []
        for item in items:
            doc = make(item)
            start = time.perf_counter()
            nlp(doc)
            times.append((time.perf_counter() - start) * 1000)
        return times

    # The latencies start from an empty token cache: the batch passes filled it with every
    # test word, and sentences whose words are all cached would flatter the elmo pipelines.
    if nlp.has_pipe("elmo"):
        bilm = get_bilm(nlp.get_pipe("elmo").model)
        bilm.token_cache_size = bilm.token_cache_size
    sentence_ms = latencies(sentence_doc, sentences[: args.latency_sentences])
    document_ms = latencies(document_doc, documents)
    return {
        "load_seconds": load_seconds,
        "rss_before_load_mb": rss_before,
        "rss_loaded_mb": rss_loaded,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "pipe_names": nlp.pipe_names,
        "batch_size": nlp.batch_size,
        "batch_words": n_words,
        "batch_sentences": len(docs),
        "batch_seconds": batch_seconds,
        "batch_words_per_s": n_words / batch_seconds,
        "batch_words_per_s_passes": [n_words / seconds for seconds in pass_seconds],
        "batch_us_per_word_by_component": {
            name: seconds * 1e6 / n_words for name, seconds in component_seconds.items()
        },
        "sentence_ms": describe(sentence_ms),
        "sentence_words_median": statistics.median(len(s) for s in sentences[: len(sentence_ms)]),
        "document_ms": describe(document_ms),
        "documents": len(documents),
        "document_words_median": statistics.median(sum(map(len, d)) for d in documents),
        "document_words_per_s": sum(sum(map(len, d)) for d in documents) / sum(document_ms) * 1000,
    }


def describe(times: list[float]) -> dict:
    ordered = sorted(times)
    return {
        "n": len(ordered),
        "median": statistics.median(ordered),
        "p90": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
        "max": ordered[-1],
    }


def summarise(rounds: list[dict], names: list[str]) -> dict:
    """Per pipeline: the fastest round's batch words/s, the lowest round medians of latency, the
    highest peak memory."""
    summary = {}
    for name in names:
        runs = [r["results"][name] for r in rounds]
        fastest = max(runs, key=lambda r: r["batch_words_per_s"])
        summary[name] = {
            "batch_words_per_s": fastest["batch_words_per_s"],
            "batch_words_per_s_rounds": [r["batch_words_per_s"] for r in runs],
            "batch_us_per_word_by_component": _fastest_components(runs),
            "sentence_ms_median": min(r["sentence_ms"]["median"] for r in runs),
            "sentence_ms_p90": min(r["sentence_ms"]["p90"] for r in runs),
            "document_ms_median": min(r["document_ms"]["median"] for r in runs),
            "document_ms_p90": min(r["document_ms"]["p90"] for r in runs),
            "document_words_per_s": max(r["document_words_per_s"] for r in runs),
            "load_seconds": min(r["load_seconds"] for r in runs),
            "rss_before_load_mb": max(r["rss_before_load_mb"] for r in runs),
            "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
        }
    return summary


def _fastest_components(runs: list[dict]) -> dict:
    """Per component, the lowest microseconds a word over the rounds (absent in older JSONs)."""
    timed = [
        r["batch_us_per_word_by_component"] for r in runs if "batch_us_per_word_by_component" in r
    ]
    return {name: min(t[name] for t in timed) for name in timed[0]} if timed else {}


def load_f1(path: Path) -> dict:
    """{pipeline: {training sentences: (mean test NER F1 in %, runs)}} from the evidence report."""
    if not path.exists():
        return {}
    result: dict = {}
    for row in json.loads(path.read_text())["summary"]:
        result.setdefault(row["pipeline"], {})[row["train_sentences"]] = (
            100 * row["test"]["ents_f"]["mean"],
            row["n"],
        )
    return result


def markdown(report: dict, f1: dict) -> str:
    m, s, summary = report["machine"], report["settings"], report["summary"]
    first = next(iter(report["rounds"][0]["results"].values()), None) if report["rounds"] else None
    lines = [
        "# Run-time cost of the five learning-curve pipelines (CPU)",
        "",
        f"- Machine: {m['cpu']}, {m['cpu_cores']} cores; {s['threads']} threads (torch, OpenMP, "
        "BLAS) per pipeline, each pipeline in its own process",
        f"- Versions: Python {m['python']}, torch {m['torch']}, spaCy {m['spacy']}, thinc "
        f"{m['thinc']}, spacy-transformers {m['spacy_transformers']}, transformers "
        f"{m['transformers']}, spacy-elmo git {m.get('git_commit', '?')}",
        f"- Date: {m['date']}",
        f"- Command: `{s['command']}`",
        "- Models: " + ", ".join(f"{k} `{v}`" for k, v in s["models"].items()),
        "",
    ]
    rounds = (
        "one round" if s["rounds"] == 1 else f"fastest of {s['rounds']} rounds (alternating order)"
    )
    passes = s.get("passes", 1)  # reports made before --passes timed one pass a round
    if passes > 1:
        rounds += f", the fastest of {passes} passes in each"
    # reports made before the latencies emptied the biLM's token cache say nothing of it
    cache = ", the biLM's token cache emptied first" if s.get("latency_token_cache") else ""
    if first:
        lines += [
            "CoNLL-2003 test, gold tokens: batch = `nlp.pipe` over the "
            f"{first['batch_sentences']:,} sentences ({first['batch_words']:,} words), one Doc "
            f"each, {rounds}; sentence = `nlp(doc)` on "
            f"each of the first {s['latency_sentences']} sentences alone (median "
            f"{first['sentence_words_median']:.0f} words{cache}); "
            "document = `nlp(doc)` on each of the "
            f"{first['documents']} documents alone "
            f"(median {first['document_words_median']:.0f} words); latencies: the lower round's "
            "median and 90th percentile. Memory: resident, before `spacy.load` (Python, spaCy, "
            "torch imported) and the peak of the process.",
            "",
            "| pipeline | batch words/s | vs baseline | sentence ms (median / p90) "
            "| document ms (median / p90) | load s | RSS before load | peak RSS "
            "| test NER F1: 1,000 / 3,000 / all |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
    base = summary.get("baseline", {}).get("batch_words_per_s")
    for name, x in summary.items():
        relative = f"{x['batch_words_per_s'] / base:.2f}x" if base else "–"
        scores = f1.get(name, {})
        cells = []
        for size in sorted(scores):
            mean, n = scores[size]
            cells.append(f"{mean:.1f} ({n})")
        lines.append(
            f"| {name} | {x['batch_words_per_s']:,.0f} | {relative} "
            f"| {x['sentence_ms_median']:.1f} / {x['sentence_ms_p90']:.1f} "
            f"| {x['document_ms_median']:.0f} / {x['document_ms_p90']:.0f} "
            f"| {x['load_seconds']:.1f} | {x['rss_before_load_mb']:,.0f} MB "
            f"| {x['peak_rss_mb']:,.0f} MB | {' / '.join(cells) or '–'} |"
        )
    if summary:
        lines += [
            "",
            "Batch words/s of every round: "
            + "; ".join(
                f"{name} " + ", ".join(f"{v:,.0f}" for v in x["batch_words_per_s_rounds"])
                for name, x in summary.items()
            )
            + ".",
        ]
    split = {
        n: x["batch_us_per_word_by_component"]
        for n, x in summary.items()
        if x.get("batch_us_per_word_by_component")
    }
    if split:
        lines += [
            "",
            "Batch time by component, microseconds a word (the same batch once more, one "
            "component at a time over all its docs; the lowest round): "
            + "; ".join(
                f"{name} "
                + ", ".join(f"{component} {us:.0f}" for component, us in parts.items())
                + f" (sum {sum(parts.values()):.0f})"
                for name, parts in split.items()
            )
            + ".",
        ]
    for name, why in report["missing"].items():
        lines += ["", f"**{name}: not measured**, {why}."]
    lines += [
        "",
        "F1: mean over the seeds that have finished (their number in brackets), from "
        "results/evidence.json; see docs/learning-curves.md.",
        "",
    ]
    return "\n".join(lines)


MARKERS = {1000: "o", 3000: "s", 14041: "^"}


def plot(report: dict, f1: dict, path: Path) -> None:
    """Test NER F1 against batch words/s: one point per pipeline and training size (a
    pipeline's other step budgets, e.g. "transformer (2x steps)", hollow, at its speed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    fig, ax = plt.subplots(figsize=(7.5, 5.0))
    for name, x in report["summary"].items():
        speed = x["batch_words_per_s"]
        rows = [row for row in f1 if row == name or row.startswith(f"{name} (")]
        for row in rows:
            points = sorted(f1[row].items())
            hollow = row != name
            ys = [mean for _, (mean, _runs) in points]
            ax.plot([speed] * len(ys), ys, color=PIPELINE_COLOURS[name], lw=0.8, alpha=0.5)
            for size, (mean, _runs) in points:
                ax.scatter(
                    speed,
                    mean,
                    marker=MARKERS.get(size, "x"),
                    s=60,
                    facecolors="none" if hollow else PIPELINE_COLOURS[name],
                    edgecolors=PIPELINE_COLOURS[name],
                )
            ax.annotate(
                row,
                (speed, ys[-1]),
                textcoords="offset points",
                xytext=(7, -4 if hollow else 4),
                color=PIPELINE_COLOURS[name],
                fontsize=9,
            )
    for size, marker in MARKERS.items():
        label = "all (14,041)" if size == 14041 else f"{size:,}"
        ax.scatter([], [], color="black", marker=marker, label=f"{label} training sentences")
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    speeds = [x["batch_words_per_s"] for x in report["summary"].values()]
    if speeds:
        ax.set_xlim(min(speeds) / 1.6, max(speeds) * 2.2)
        ticks = (100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000)
        ax.set_xticks([v for v in ticks if min(speeds) / 1.6 <= v <= max(speeds) * 2.2])
    ax.set_xlabel(
        f"words/s, nlp.pipe on CoNLL-2003 test, {report['settings']['threads']} CPU threads (log)"
    )
    ax.set_ylabel("test NER F1 (mean over seeds)")
    ax.set_title("Accuracy against speed: five spaCy tagger + NER pipelines")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3, fontsize=8, frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
