"""`spacy-elmo pretrain` across two machines: two torchrun agents (`--nnodes 2`, one process
each) meet at a c10d rendezvous on 127.0.0.1, train, and resume.

Everything runs inside a private network namespace (`unshare --net`, loopback brought up), so
the agents, the rendezvous store and gloo can reach nothing but 127.0.0.1 and no port of the
machine is taken; gloo is told to use `lo`. The two "nodes" share this file system, as real
nodes share the run directory on shared storage (docs/pretraining-multinode.md).

The same run under `torchrun --nproc_per_node 2` on one node is the reference: rank r takes
every r-th batch of the one global stream whatever node it is on, and the gradient all-reduce
over two ranks is one float addition, so the weights are equal bit for bit.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from spacy_elmo.pretrain.corpus import iter_batches

from .test_pretrain import write_corpus

# Runs inside the namespace: brings loopback up, then runs each phase's commands at once
# (one per node) and waits for all of them; logs go to files, exit codes to stdout.
DRIVER = r"""
import json, os, subprocess, sys
spec = json.loads(sys.argv[1])
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
env = {**os.environ, **spec["env"]}
results = []
for phase in spec["phases"]:
    procs = []
    for node, command in enumerate(phase["commands"]):
        log = open(os.path.join(spec["logs"], f"{phase['name']}.node{node}.log"), "w")
        procs.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env))
    codes = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=spec["timeout"]))
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            codes.append("timeout")
    results.append({"phase": phase["name"], "codes": codes})
    if codes != [0] * len(codes):
        break
print(json.dumps(results))
"""
RENDEZVOUS = "127.0.0.1:29400"  # a port of the test's own namespace: nothing else is there
STEPS, RESUMED_STEPS = 8, 12


def namespace_command() -> list[str]:
    """`unshare` into a new network namespace (mapping to root when not root), or skip."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs unshare (util-linux) and ip (iproute2) for a private network namespace")
    command = ["unshare", "--net"] + ([] if os.geteuid() == 0 else ["--map-root-user"])
    probe = subprocess.run(
        [*command, "ip", "link", "set", "lo", "up"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        pytest.skip(f"cannot make a private network namespace here: {probe.stderr.strip()}")
    return command


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args]


def pretrain(run: Path, corpus: Path, max_steps: int, *extra: str) -> list[str]:
    """`spacy-elmo pretrain CORPUS RUN` (the run directory last) on the tiny preset."""
    return [
        "-m", "spacy_elmo.cli", "pretrain", str(corpus), str(run), "--preset", "tiny",
        "--pretokenized", "--vocab-size", "100", "--min-count", "1",
        "--max-steps", str(max_steps), "--batch-tokens", "256", "--lr", "0.01",
        "--warmup-steps", "5", "--eval-every", "4", "--checkpoint-every", "4",
        "--log-every", "2", "--threads", "1", *extra,
    ]  # fmt: skip


def two_nodes(run_id: str, command: list[str]) -> list[list[str]]:
    """One torchrun agent per node, one process each; the first agent hosts the c10d store."""
    rendezvous = [
        "--nnodes", "2", "--nproc_per_node", "1", "--rdzv_backend", "c10d",
        "--rdzv_endpoint", RENDEZVOUS, "--rdzv_id", run_id, "--local_addr", "127.0.0.1",
    ]  # fmt: skip
    return [
        torchrun(*rendezvous, "--rdzv_conf", f"is_host={int(node == 0)}", *command)
        for node in range(2)
    ]


def one_node(command: list[str]) -> list[list[str]]:
    return [torchrun("--standalone", "--nproc_per_node", "2", *command)]


def weights(directory: Path) -> dict[str, torch.Tensor]:
    return load_file(str(directory / "model.safetensors"))


@pytest.mark.slow  # four torchrun launches of two processes each: 2-3 minutes on 2 cores
def test_two_nodes_train_and_resume_as_one_node_does(tmp_path):
    unshare = namespace_command()
    corpus = write_corpus(tmp_path / "corpus.txt")
    nodes, single = tmp_path / "two_nodes", tmp_path / "one_node"
    logs = tmp_path / "logs"
    logs.mkdir()
    resume = ("--resume",)
    phases = [
        {"name": "nodes", "commands": two_nodes("train", pretrain(nodes, corpus, STEPS))},
        {"name": "single", "commands": one_node(pretrain(single, corpus, STEPS))},
        {
            "name": "snapshot",  # the models of STEPS steps, before the resumed runs replace them
            "commands": [
                ["cp", "-r", str(nodes / "model"), str(tmp_path / "two_nodes_first")],
                ["cp", "-r", str(single / "model"), str(tmp_path / "one_node_first")],
            ],
        },
        {
            "name": "nodes-resume",
            "commands": two_nodes("resume", pretrain(nodes, corpus, RESUMED_STEPS, *resume)),
        },
        {
            "name": "single-resume",
            "commands": one_node(pretrain(single, corpus, RESUMED_STEPS, *resume)),
        },
    ]
    spec = {
        "phases": phases,
        "logs": str(logs),
        "timeout": 240,
        "env": {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"},
    }
    result = subprocess.run(
        [*unshare, sys.executable, "-c", DRIVER, json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    tails = "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(logs.iterdir()))
    assert result.returncode == 0, result.stderr + tails
    finished = json.loads(result.stdout.strip().splitlines()[-1])
    assert [(p["phase"], p["codes"]) for p in finished] == [
        ("nodes", [0, 0]),
        ("single", [0]),
        ("snapshot", [0, 0]),
        ("nodes-resume", [0, 0]),
        ("single-resume", [0]),
    ], tails

    # Trained across the two nodes: both ranks took part, the loss is finite, a model written.
    first = json.loads((tmp_path / "two_nodes_first" / "pretrain.json").read_text())
    assert first["world_size"] == 2 and first["steps"] == STEPS
    assert len(first["rank_checksums"]) == 2
    assert first["rank_checksums"][0] == first["rank_checksums"][1]
    # Rank 0 reads the even batches of the one stream; the tokens are counted for both ranks.
    stream = iter_batches(nodes / "corpus" / "train.txt", 0, 256)
    batches = [next(stream)[1] for _ in range(2 * STEPS)]
    assert first["tokens_seen"] == 2 * sum(len(s) for b in batches[0::2] for s in b)
    metrics = [json.loads(x) for x in (nodes / "metrics.jsonl").read_text().splitlines()]
    losses = [m["train_ppl"] for m in metrics if "train_ppl" in m]
    assert losses and all(math.isfinite(loss) for loss in losses)
    # ... exactly as the same run on one node with two processes.
    reference_summary = json.loads((tmp_path / "one_node_first" / "pretrain.json").read_text())
    assert first == reference_summary | {"train_seconds": first["train_seconds"]}
    trained, reference = weights(tmp_path / "two_nodes_first"), weights(tmp_path / "one_node_first")
    assert trained.keys() == reference.keys()
    for key in trained:
        assert torch.equal(trained[key], reference[key]), key

    # Resumed across the two nodes from the checkpoint, to more steps: the same again.
    resumed = json.loads((nodes / "model" / "pretrain.json").read_text())
    assert resumed["world_size"] == 2 and resumed["steps"] == RESUMED_STEPS
    assert resumed["rank_checksums"][0] == resumed["rank_checksums"][1]
    assert resumed["rank_checksums"] != first["rank_checksums"]
    assert resumed == json.loads((single / "model" / "pretrain.json").read_text()) | {
        "train_seconds": resumed["train_seconds"]
    }
    after, reference = weights(nodes / "model"), weights(single / "model")
    assert after.keys() == reference.keys()
    for key in after:
        assert torch.equal(after[key], reference[key]), key
    metrics = [json.loads(x) for x in (nodes / "metrics.jsonl").read_text().splitlines()]
    assert max(m["step"] for m in metrics) == RESUMED_STEPS
