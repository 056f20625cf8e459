"""Corpus runs on Ray. Run by test_ray.py inside a private network namespace (loopback only):
do not run this file by itself outside one.

Most cases share one two-node cluster (`ray start --head` and a second `ray start`, one CPU
each, on 127.0.0.1); the driver-kill case starts local instances of its own, as a user's
`--workers` would.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import h5py
import numpy
import pytest

from spacy_elmo import BiLM
from spacy_elmo.corpus import Cluster, apply_corpus, embed_corpus
from spacy_elmo.corpus.embed import EmbedJob
from spacy_elmo.corpus.embed_file import embed_file
from spacy_elmo.corpus.plan import plan_inputs
from spacy_elmo.corpus.reaper import descendants
from spacy_elmo.corpus.runner import MANIFEST_NAME, MARK, CorpusRunError, read_manifest, run_corpus
from spacy_elmo.util.files import file_sha256

REPO = Path(__file__).resolve().parent.parent.parent
WORDS = (
    "the cat sat on a mat while dogs ran far away over green hills and Anna visited Paris "
    "with Ben , who likes rivers ; 1984 was a year ."
).split()

if os.environ.get("SPACY_ELMO_TEST_NETNS") != "1":  # pragma: no cover - outside test_ray.py
    pytest.skip("run by tests/corpus/test_ray.py in a network namespace", allow_module_level=True)


# ----------------------------------------------------------------------------- helpers
def sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 14))) for _ in range(n)]
    lines[n // 3] = ""  # an empty line
    lines[-1] = lines[0]  # a repeated sentence: sentence_to_index keeps its first index
    return lines


def write(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def assert_same_as_embed(bilm, text: Path, output: Path, atol: float = 1e-5, **options) -> None:
    """`output` equals single-process `embed_file` of `text`: keys, sentence_to_index, layers."""
    with tempfile.TemporaryDirectory() as folder:
        reference = Path(folder) / "reference.hdf5"
        embed_file(bilm, text, reference, progress=False, **options)
        with h5py.File(reference) as expected, h5py.File(output) as actual:
            assert set(actual) == set(expected)
            assert actual["sentence_to_index"][0] == expected["sentence_to_index"][0]
            for key in expected:
                if key != "sentence_to_index":
                    assert actual[key].dtype == expected[key].dtype
                    assert actual[key].shape == expected[key].shape
                    numpy.testing.assert_allclose(actual[key][()], expected[key][()], atol=atol)


def stamps(folder: Path) -> dict[str, tuple[int, int]]:
    """(inode, mtime_ns) of every output: a rewritten output gets a new inode (rename)."""
    return {
        p.relative_to(folder).as_posix(): (p.stat().st_ino, p.stat().st_mtime_ns)
        for p in folder.rglob("*.hdf5")
    }


def ray_processes() -> dict[int, str]:
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    found = {}
    for line in out.splitlines():
        pid, _, args = line.strip().partition(" ")
        if "ray" in args.lower() and int(pid) != os.getpid():
            found[int(pid)] = args
    return found


def wait_gone(before: dict[int, str], seconds: float = 20.0) -> dict[int, str]:
    """Ray processes that were not there `before` and are still there after `seconds`, but for
    the module cluster's (below this process; a dead driver's orphans are not)."""
    deadline = time.monotonic() + seconds
    while True:
        ours = {process.pid for process in descendants()}
        left = {
            pid: args
            for pid, args in ray_processes().items()
            if pid not in before and pid not in ours
        }
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def tiny(allennlp_fixture):
    return {
        "options_file": str(allennlp_fixture / "options.json"),
        "weights_file": str(allennlp_fixture / "lm_weights.hdf5"),
    }


@pytest.fixture(scope="module")
def tiny_bilm(tiny):
    import torch

    torch.set_num_threads(1)
    return BiLM.load(None, options=tiny["options_file"], weights=tiny["weights_file"])


@pytest.fixture(scope="module")
def cluster():
    """A two-node Ray cluster on 127.0.0.1, one CPU per node; its address."""
    port = free_port()
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths are limited
    common = ["--block", "--num-cpus=1", "--node-ip-address=127.0.0.1"]
    common += ["--object-store-memory=80000000", "--disable-usage-stats"]
    ray = str(Path(sys.executable).parent / "ray")
    logs = open(Path(temp) / "cluster.log", "w")
    head = subprocess.Popen(
        [
            ray,
            "start",
            "--head",
            f"--port={port}",
            "--include-dashboard=false",
            f"--temp-dir={temp}",
        ]
        + common,
        stdout=logs,
        stderr=subprocess.STDOUT,
    )
    nodes = [head]
    try:
        _wait_for_port(port)
        nodes.append(
            subprocess.Popen(
                [ray, "start", f"--address=127.0.0.1:{port}"] + common,
                stdout=logs,
                stderr=subprocess.STDOUT,
            )
        )
        address = f"127.0.0.1:{port}"
        code = (
            f"import ray, time; ray.init(address={address!r}, logging_level='ERROR')\n"
            "t = time.time()\n"
            "while ray.cluster_resources().get('CPU', 0) < 2 and time.time() - t < 90: "
            "time.sleep(0.3)\n"
            "assert len([n for n in ray.nodes() if n['Alive']]) == 2, ray.nodes()"
        )
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
        yield address
    finally:
        for node in reversed(nodes):
            node.send_signal(signal.SIGTERM)
        for node in nodes:
            try:
                node.wait(timeout=60)
            except subprocess.TimeoutExpired:
                node.kill()
        logs.close()
        for pid, args in ray_processes().items():  # anything of this cluster still running
            if temp in args:
                os.kill(pid, signal.SIGKILL)


def _wait_for_port(port: int, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"the Ray head did not listen on port {port} in {seconds} s")


# ----------------------------------------------------------------------------- cases
def test_outputs_equal_single_process_embed_on_two_nodes(tmp_path, cluster, tiny, tiny_bilm):
    """Part 6 and 5: a two-node cluster joined with --address; each output (a whole file, a
    file cut into 6 parts and joined) equals `embed` of that file; float16 + gzip redo all."""
    a = write(tmp_path / "in" / "a.txt", sentences(7, seed=1))
    b = write(tmp_path / "in" / "sub" / "b.txt", sentences(53, seed=2))
    out = tmp_path / "out"
    two = Cluster(workers=2, address=cluster, threads_per_worker=1)
    result = embed_corpus(tmp_path / "in", out, **tiny, shard_lines=10, cluster=two, progress=False)
    assert sorted(result.written) == ["a.hdf5", "sub/b.hdf5"] and result.stats.lines == 60
    assert len(result.stats.nodes) == 2, "both nodes ran workers"
    assert len(result.stats.workers) == 2
    assert_same_as_embed(tiny_bilm, a, out / "a.hdf5")
    assert_same_as_embed(tiny_bilm, b, out / "sub" / "b.hdf5")
    records = read_manifest(out)
    for name, text in (("a.hdf5", a), ("sub/b.hdf5", b)):
        assert records[name]["output_sha256"] == file_sha256(out / name)
        assert records[name]["input_sha256"] == file_sha256(text)
        assert records[name]["lines"] == len(text.read_text().splitlines())
        assert records[name]["model"]["kind"] == "allennlp"
    leftovers = [p for p in out.rglob("*") if p.name.startswith(".") and ".lock" not in p.name]
    assert leftovers == [], "parts and temporary files are removed"

    result = embed_corpus(
        tmp_path / "in",
        out,
        **tiny,
        shard_lines=10,
        float16=True,
        compression="gzip",
        cluster=two,
        progress=False,
    )
    assert sorted(result.written) == ["a.hdf5", "sub/b.hdf5"], "other options: redone"
    for text, name in ((a, "a.hdf5"), (b, "sub/b.hdf5")):
        assert_same_as_embed(
            tiny_bilm, text, out / name, atol=2e-3, float16=True, compression="gzip"
        )
    assert read_manifest(out)["a.hdf5"]["options"]["float16"] is True


def test_rerun_skips_done_and_redoes_changed_input_and_model(
    tmp_path, cluster, tiny, tiny_bilm, bilm_dir
):
    texts = [write(tmp_path / "in" / f"{i}.txt", sentences(12, seed=10 + i)) for i in range(3)]
    out = tmp_path / "out"
    run = Cluster(workers=2, address=cluster, threads_per_worker=1)
    first = embed_corpus(tmp_path / "in", out, **tiny, cluster=run, progress=False)
    assert len(first.written) == 3
    before = stamps(out)

    again = embed_corpus(tmp_path / "in", out, **tiny, cluster=run, progress=False)
    assert again.written == [] and sorted(again.skipped) == ["0.hdf5", "1.hdf5", "2.hdf5"]
    assert again.stats is None, "nothing to do: Ray is not started"
    assert stamps(out) == before

    write(texts[1], sentences(9, seed=99))  # a changed input
    changed = embed_corpus(tmp_path / "in", out, **tiny, cluster=run, progress=False)
    assert changed.written == ["1.hdf5"]
    after = stamps(out)
    assert after["0.hdf5"] == before["0.hdf5"] and after["2.hdf5"] == before["2.hdf5"]
    assert after["1.hdf5"] != before["1.hdf5"]
    assert_same_as_embed(tiny_bilm, texts[1], out / "1.hdf5")

    other = embed_corpus(tmp_path / "in", out, model=str(bilm_dir), cluster=run, progress=False)
    assert sorted(other.written) == ["0.hdf5", "1.hdf5", "2.hdf5"], "another model: all redone"
    saved = BiLM.load(str(bilm_dir))
    for text in texts:
        assert_same_as_embed(saved, text, out / f"{text.stem}.hdf5")
    assert {r["model"]["kind"] for r in read_manifest(out).values()} == {"saved"}


def test_apply_gives_the_annotations_of_nlp_pipe(tmp_path, cluster, bilm_dir):
    import spacy
    from spacy.tokens import DocBin
    from spacy.training import Example

    from tests.pipeline.pipeline_util import synthetic_docs, tiny_nlp

    nlp = tiny_nlp(bilm_dir, pipeline=("elmo", "tagger", "ner", "sentencizer"))
    gold = synthetic_docs(nlp, 20, seed=0)
    nlp.initialize(lambda: [Example(nlp.make_doc(d.text), d) for d in gold])
    nlp.to_disk(tmp_path / "pipeline")
    texts = sentences(25, seed=3)
    write(tmp_path / "in" / "a.txt", texts)
    jsonl = [json.dumps({"body": t, "id": i}) for i, t in enumerate(texts[:9])]
    write(tmp_path / "in" / "deep" / "b.jsonl", jsonl[:4] + [""] + jsonl[4:])
    DocBin(docs=[nlp.make_doc(t) for t in texts[5:12]]).to_disk(tmp_path / "in" / "c.spacy")
    out = tmp_path / "out"
    result = apply_corpus(
        tmp_path / "pipeline",
        tmp_path / "in",
        out,
        text_key="body",
        shard_docs=10,
        cluster=Cluster(workers=2, address=cluster, threads_per_worker=1),
        progress=False,
    )
    assert sorted(result.written) == ["a.spacy", "c.spacy", "deep/b.spacy"]
    loaded = spacy.load(tmp_path / "pipeline")
    for name, inputs in (("a", texts), ("deep/b", texts[:9]), ("c", texts[5:12])):
        got = list(DocBin().from_disk(out / f"{name}.spacy").get_docs(loaded.vocab))
        want = list(loaded.pipe(inputs))
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert [t.text for t in g] == [t.text for t in w]
            assert [t.whitespace_ for t in g] == [t.whitespace_ for t in w]
            assert [t.tag_ for t in g] == [t.tag_ for t in w]
            assert [(e.start, e.end, e.label_) for e in g.ents] == [
                (e.start, e.end, e.label_) for e in w.ents
            ]
            assert [s.start for s in g.sents] == [s.start for s in w.sents]
            assert list(g._.elmo_mix_coefficients) == list(w._.elmo_mix_coefficients)
            assert g._.elmo_layers is None  # not stored (27 KB a sentence)
    assert read_manifest(out)["deep/b.spacy"]["lines"] == 9


def test_worker_killed_mid_shard_is_retried(tmp_path, cluster):
    """SIGKILL a worker while it runs a shard: Ray restarts it, the shard runs again, and every
    output is whole and equals `embed`."""
    texts = [write(tmp_path / "in" / f"{i}.txt", sentences(120, seed=20 + i)) for i in range(4)]
    killed: list[int] = []
    stop = threading.Event()

    def kill_a_running_shard() -> None:
        while not stop.is_set() and not killed:
            for pid, args in ray_processes().items():
                if args.startswith("ray::CorpusWorker.run"):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                    return
            time.sleep(0.02)

    killer = threading.Thread(target=kill_a_running_shard)
    killer.start()
    try:
        result = embed_corpus(
            tmp_path / "in",
            tmp_path / "out",
            model="bundled",
            shard_lines=60,
            cluster=Cluster(workers=2, address=cluster, threads_per_worker=1),
            progress=False,
        )
    finally:
        stop.set()
        killer.join()
    assert killed, "a worker was killed while running a shard"
    assert result.stats.failures == [] and len(result.written) == 4
    assert killed[0] not in {int(w.split(":")[1]) for w in result.stats.workers if True} or (
        len(result.stats.workers) > 2
    ), "the killed worker was replaced"
    bundled = BiLM.load("bundled")
    for text in texts:
        assert_same_as_embed(bundled, text, tmp_path / "out" / f"{text.stem}.hdf5")


def test_a_failed_shard_names_its_input_and_the_rest_is_written(tmp_path, cluster, tiny, capfd):
    good = write(tmp_path / "in" / "good.txt", sentences(8, seed=5))
    bad = write(tmp_path / "in" / "bad.txt", sentences(8, seed=6))
    out = tmp_path / "out"
    inputs = plan_inputs(tmp_path / "in", out, (".txt",), ".hdf5", 100)
    bad.write_bytes(b"fine\n\xff\xfe broken after the check\n")  # changed after planning
    job = EmbedJob(None, **tiny)
    model = {"kind": "allennlp", "name": "tiny", "sha256": "x"}
    engine = Cluster(workers=1, address=cluster)
    with pytest.raises(CorpusRunError, match=r"bad\.txt.*line 2: not UTF-8") as error:
        run_corpus("embed-corpus", inputs, out, job, model, engine, progress=False)
    printed = capfd.readouterr().err
    assert f"error: {bad}: input file {bad}, line 2: not UTF-8 text" in printed, printed
    assert error.value.result.written == ["good.hdf5"]
    assert list(read_manifest(out)) == ["good.hdf5"]
    assert not (out / "bad.hdf5").exists()
    assert good.exists()


DRIVER = """
import sys
from spacy_elmo.corpus import Cluster, embed_corpus
embed_corpus(sys.argv[1], sys.argv[2], shard_lines=40, cluster=Cluster(workers=1), progress=False)
"""


def test_killed_driver_leaves_whole_outputs_and_the_rerun_finishes(tmp_path):
    """SIGKILL the driver of a local instance mid-run: its Ray processes end with it, only whole
    outputs have final names; the re-run (the CLI) finishes the rest without rewriting them,
    and its own Ray processes end when it exits."""
    texts = [write(tmp_path / "in" / f"{i}.txt", sentences(40, seed=30 + i)) for i in range(10)]
    out = tmp_path / "out"
    before = ray_processes()
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path / "in"), str(out)])
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and driver.poll() is None:
        if len(read_manifest(out)) >= 3:
            break
        time.sleep(0.05)
    assert driver.poll() is None, "the driver was still running"
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    assert wait_gone(before) == {}, "the local instance's processes ended with the driver"
    # An output is recorded, then installed: the kill may fall between the two for the last one.
    finished = {name for name in read_manifest(out) if (out / name).is_file()}
    assert 2 <= len(finished) < 10
    bundled = BiLM.load("bundled")
    for path in out.rglob("*.hdf5"):  # every output under its final name is whole
        assert_same_as_embed(bundled, tmp_path / "in" / f"{path.stem}.txt", path)
    kept = {name: stamp for name, stamp in stamps(out).items() if name in finished}

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    rerun = subprocess.run(
        [sys.executable, "-m", "spacy_elmo.cli", "embed-corpus", str(tmp_path / "in"), str(out)]
        + ["--workers", "1", "--shard-lines", "40", "-q"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert rerun.returncode == 0, rerun.stderr
    assert f"{len(finished)} up to date" in rerun.stdout
    assert wait_gone(before) == {}, "the re-run's Ray processes ended with it"
    after = stamps(out)
    assert {name: after[name] for name in kept} == kept, "finished outputs not rewritten"
    assert sorted(read_manifest(out)) == sorted(f"{i}.hdf5" for i in range(10))
    for text in texts:
        if f"{text.stem}.hdf5" not in finished:
            assert_same_as_embed(bundled, text, out / f"{text.stem}.hdf5")
    assert not list(out.rglob("*.tmp"))
    assert not [p for p in out.rglob("*") if MARK in p.name], "the killed run's staged files"
    assert (out / MANIFEST_NAME).exists()


def test_workers_that_cannot_be_placed_are_refused(tmp_path, cluster, tiny):
    """A worker needing more than any node has would wait for ever: refused with the reason."""
    write(tmp_path / "in" / "a.txt", sentences(3, seed=7))
    cases = [
        (Cluster(workers=1, address=cluster, gpus_per_worker=1), r"need 1 GPUs; .* has 0"),
        (
            Cluster(workers=1, address=cluster, threads_per_worker=2),
            r"1 workers x 2 threads do not fit .* nodes have 1, 1 CPUs",
        ),
    ]
    for engine, message in cases:
        with pytest.raises(ValueError, match=message):
            embed_corpus(tmp_path / "in", tmp_path / "out", **tiny, cluster=engine, progress=False)
    assert not (tmp_path / "out" / "a.hdf5").exists()


def test_whole_parts_of_an_interrupted_run_are_reused_never_others(
    tmp_path, cluster, tiny, tiny_bilm
):
    """A part left whole by an interrupted run (same input, model, options) is joined without
    being embedded again; parts of another input or model (another key) are deleted unused."""
    from spacy_elmo.corpus.embed import model_identity
    from spacy_elmo.corpus.runner import parts_dir
    from spacy_elmo.weights.sources import resolve_source

    text = write(tmp_path / "in" / "big.txt", sentences(30, seed=40))
    out = tmp_path / "out"
    source = resolve_source(None, tiny["options_file"], tiny["weights_file"])
    (item,) = plan_inputs(tmp_path / "in", out, (".txt",), ".hdf5", 10)
    folder = parts_dir(out, item, model_identity(source), EmbedJob(None, **tiny).options())
    assert folder.parent == out and folder.name.startswith(".big.hdf5.parts-")
    middle = item.shards[1]
    part = folder / f"{middle.first:012d}-{middle.count}.hdf5"
    embed_file(tiny_bilm, text, part, progress=False, lines=middle)
    stale = out / ".big.hdf5.parts-0123456789abcdef" / f"{middle.first:012d}-{middle.count}.hdf5"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"parts of another model")
    result = embed_corpus(
        tmp_path / "in",
        out,
        **tiny,
        shard_lines=10,
        cluster=Cluster(workers=2, address=cluster, threads_per_worker=1),
        progress=False,
    )
    assert result.written == ["big.hdf5"]
    assert result.stats.lines == 20, "lines 11-20 came from the part already there"
    assert_same_as_embed(tiny_bilm, text, out / "big.hdf5")
    assert not part.parent.exists() and not stale.parent.exists()


def test_a_name_that_is_not_utf8_is_kept_whole_through_ray(tmp_path, cluster, tiny, tiny_bilm):
    """A file name with a byte that is not UTF-8 goes to the workers and back, and into the
    manifest, whole: the output has the input's name, and the re-run finds it done."""
    name = os.fsdecode(b"caf\xe9.txt")  # Latin-1, not UTF-8
    text = write(tmp_path / "in" / "sub" / name, sentences(12, seed=50))
    write(tmp_path / "in" / "plain.txt", sentences(3, seed=51))
    user = tmp_path / "out" / ".notes.tmp"
    user.parent.mkdir()
    user.write_text("a user's own file")
    engine = Cluster(workers=2, address=cluster, threads_per_worker=1)
    result = embed_corpus(
        tmp_path / "in", tmp_path / "out", **tiny, shard_lines=5, cluster=engine, progress=False
    )
    output = tmp_path / "out" / "sub" / os.fsdecode(b"caf\xe9.hdf5")
    assert sorted(result.written) == ["plain.hdf5", output.relative_to(tmp_path / "out").as_posix()]
    assert_same_as_embed(tiny_bilm, text, output)
    (tmp_path / "out" / MANIFEST_NAME).read_bytes().decode("utf-8")  # still UTF-8 text
    again = embed_corpus(
        tmp_path / "in", tmp_path / "out", **tiny, shard_lines=5, cluster=engine, progress=False
    )
    assert again.stats is None and len(again.skipped) == 2
    assert user.read_text() == "a user's own file"


def test_two_runs_side_by_side_end_only_their_own_processes(tmp_path, tiny):
    """Two `embed-corpus` runs started from one script (one process group), each with its local
    Ray instance, and a bystander whose command line holds "ray" (a `x-ray-report` job): both
    runs finish, whichever ends first, and the bystander is still running after both."""
    bystander = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)", "x-ray-report", "arrays"]
    )
    runs = []
    try:
        for name, lines in (("short", 6), ("long", 400)):
            write(tmp_path / name / "in" / "a.txt", sentences(lines, seed=len(name)))
            argv = [sys.executable, "-m", "spacy_elmo.cli", "embed-corpus"]
            argv += [str(tmp_path / name / "in"), str(tmp_path / name / "out"), "-q"]
            argv += ["--options", tiny["options_file"], "--weights", tiny["weights_file"]]
            argv += ["--workers", "1", "--shard-lines", "50"]
            env = {**os.environ, "PYTHONPATH": str(REPO)}
            runs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         text=True, env=env))  # fmt: skip
        for run in runs:
            out, err = run.communicate(timeout=600)
            assert run.returncode == 0, err
            assert err == "", err  # nothing of Ray's on the terminal
        assert bystander.poll() is None, "the bystander was killed"
    finally:
        bystander.kill()
        for run in runs:
            if run.poll() is None:
                run.kill()
    assert sorted(read_manifest(tmp_path / "long" / "out")) == ["a.hdf5"]
