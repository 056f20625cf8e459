"""A 50k-token doc: memory stays at the stored result plus bounded per-batch work.

Measured as the growth of the process's peak RSS while `nlp(doc)` runs, in a fresh process.
"""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = r"""
import json, sys
import numpy, spacy, torch
from spacy.tokens import Doc
from spacy_elmo import BiLM, BiLMOptions

options = {
    "char_cnn": {"embedding": {"dim": 4}, "filters": [[1, 8], [2, 8], [3, 16]], "n_highway": 1,
                 "activation": "relu"},
    "lstm": {"dim": 128, "projection_dim": 128, "n_layers": 2, "cell_clip": 3, "proj_clip": 3,
             "use_skip_connections": True},
}
torch.manual_seed(0)
BiLM(BiLMOptions.from_dict(options)).save(sys.argv[1])
nlp = spacy.blank("en")
nlp.add_pipe("elmo", config={"model": {
    "char_embedding_dim": 4, "filters": [[1, 8], [2, 8], [3, 16]], "n_highway": 1,
    "lstm_dim": 128, "projection_dim": 128, "n_layers": 2, "max_tokens": 256,
    "batch_tokens": 4096}})
nlp.config["initialize"]["components"]["elmo"] = {
    "weights": {"@misc": "spacy_elmo.SavedBiLM.v1", "path": sys.argv[1]}}
nlp.initialize()
nlp(Doc(nlp.vocab, words=["warm", "up"] * 2000))  # allocator pools, lazy imports


def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024


doc = Doc(nlp.vocab, words=[f"w{i % 997}" for i in range(int(sys.argv[2]))])
open("/proc/self/clear_refs", "w").write("5")  # reset the peak (VmHWM) to the current RSS
before = status("VmRSS:")
doc = nlp(doc)
peak = status("VmHWM:")
print(json.dumps({"extra": peak - before, "result": doc._.elmo_layers.nbytes,
                  "shape": list(doc._.elmo_layers.shape)}))
"""


def measure(tmp_path, n_tokens: int) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "bilm"), str(n_tokens)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def least_overhead(tmp_path, n_tokens: int, runs: int = 3) -> dict:
    """The run with the smallest peak beyond the result: RSS noise (glibc keeping freed
    blocks, varying between fresh processes by tens of MB) only ever adds."""
    return min(
        (measure(tmp_path, n_tokens) for _ in range(runs)), key=lambda r: r["extra"] - r["result"]
    )


def test_50k_token_doc_has_no_full_size_intermediate(tmp_path):
    small, large = least_overhead(tmp_path, 12500), least_overhead(tmp_path, 50000)
    assert large["shape"] == [3, 50000, 256]
    full_size = large["result"]  # (3, 50000, 256) float32 = 153.6 MB
    overhead_small = small["extra"] - small["result"]
    overhead_large = large["extra"] - large["result"]
    # The work beyond the stored result does not grow with the document (per-batch only) ...
    assert overhead_large < overhead_small + 0.25 * full_size, (small, large)
    # ... and is far below one more full-size float32 array.
    assert overhead_large < 0.75 * full_size, (small, large)
