"""`spacy-elmo perplexity` reports what decides whether two perplexities compare: the
vocabulary's size, the tokens scored and the out-of-vocabulary rate, in JSON and in text."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from spacy_elmo.cli import app
from spacy_elmo.weights.sources import resolve_source

# Pre-tokenised; "Zorbluxia" and "qwfpgj" are in no English vocabulary.
HELD_OUT = """The company said on Monday that its profits rose .
He visited Zorbluxia twice , said qwfpgj .
"""


def test_perplexity_reports_the_vocabulary_the_tokens_and_the_oov_rate(tmp_path):
    text = tmp_path / "held_out.txt"
    text.write_text(HELD_OUT, encoding="utf-8")
    result = CliRunner().invoke(app, ["perplexity", str(text), "--pretokenized"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    vocab_file = resolve_source("bundled").path / "vocab.txt"
    words = set(vocab_file.read_text(encoding="utf-8").split("\n"))
    tokens = HELD_OUT.split()
    oov = [token for token in tokens if token not in words]
    assert "Zorbluxia" in oov and "qwfpgj" in oov
    assert report["vocab_size"] == len([w for w in words if w])
    assert report["tokens"] == len(tokens) and report["sentences"] == 2
    assert report["targets_per_direction"] == len(tokens) + 2
    assert report["oov_tokens"] == len(oov)
    assert report["oov_rate"] == len(oov) / len(tokens)
    assert report["unk_targets"] == "included"
    line = result.stderr.strip()
    assert f"over {len(tokens)} tokens in 2 sentences" in line
    assert f"vocabulary of {report['vocab_size']:,} words" in line
    assert f"{len(oov)} tokens ({len(oov) / len(tokens):.2%}) out of it" in line
