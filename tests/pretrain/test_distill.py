"""Static vectors as auxiliary pretraining targets (`spacy_elmo.pretrain.distill`)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import spacy
import torch

from spacy_elmo.pretrain import pretrain
from spacy_elmo.pretrain.distill import NO_VECTOR, DistillationHeads, StaticVectors

from .test_pretrain import tiny_config, write_corpus


def _vectors() -> StaticVectors:
    table = np.array([[3.0, 4.0, 0.0], [0.0, 0.0, 2.0], [0.0, 0.0, 0.0]], dtype=np.float32)
    return StaticVectors(table, {"bank": 0, "river": 1, "void": 2})


def test_rows_are_looked_up_by_form_then_lower_case():
    vectors = _vectors()
    assert vectors.row("bank") == 0
    assert vectors.row("Bank") == 0  # lower-case fallback
    assert vectors.row("River") == 1
    assert vectors.row("loan") == NO_VECTOR
    assert vectors.row("void") == NO_VECTOR  # a zero row is no vector
    np.testing.assert_allclose(vectors.table[0].numpy(), [0.6, 0.8, 0.0])  # unit rows


def test_target_rows_have_no_vector_at_boundaries_and_padding():
    rows = _vectors().target_rows([["the", "bank"], ["river"]])
    assert rows.tolist() == [[-1, -1, 0, -1], [-1, 1, -1, -1]]


def test_non_finite_tables_are_refused():
    with pytest.raises(ValueError, match="NaN"):
        StaticVectors(np.array([[np.nan, 1.0]], dtype=np.float32), {"a": 0})


def test_losses_equal_a_numpy_computation():
    torch.manual_seed(0)
    vectors = _vectors()
    heads = DistillationHeads(4, vectors.table)
    tokens, forward, backward = (torch.randn(2, 4, 4) for _ in range(3))
    rows = vectors.target_rows([["the", "bank"], ["river"]])
    got = heads.losses(tokens, forward, backward, rows).detach().numpy()

    def distance(head, hidden, row):
        predicted = hidden.numpy() @ head.weight.detach().numpy().T + head.bias.detach().numpy()
        unit = vectors.table[row].numpy()
        return 1.0 - predicted @ unit / np.linalg.norm(predicted)

    valid = [(b, t) for b in range(2) for t in range(4) if rows[b, t] >= 0]
    token = sum(distance(heads.token, tokens[b, t], rows[b, t]) for b, t in valid)
    # forward LM at t predicts t + 1; backward LM at t predicts t - 1
    context = sum(distance(heads.context, forward[b, t - 1], rows[b, t]) for b, t in valid)
    context += sum(distance(heads.context, backward[b, t + 1], rows[b, t]) for b, t in valid)
    np.testing.assert_allclose(got, [token, len(valid), context, 2 * len(valid)], rtol=1e-5)


def test_pretraining_with_static_vectors_lowers_the_cosine_distances(tmp_path):
    nlp = spacy.blank("en")
    rng = np.random.default_rng(0)
    for word in ["the", "river", "bank", "loan", "water", "boat", "shore", "friend", "she"]:
        nlp.vocab.set_vector(word, rng.standard_normal(8).astype(np.float32))
    nlp.to_disk(tmp_path / "vectors")
    corpus = write_corpus(tmp_path / "corpus.txt")
    config = tiny_config(
        tmp_path, corpus, static_vectors=str(tmp_path / "vectors"), max_steps=60, log_every=10
    )
    summary = pretrain(config)
    assert summary["steps"] == 60
    records = [
        json.loads(line)
        for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
        if "token_cosine" in line
    ]
    assert records[-1]["token_cosine"] < records[0]["token_cosine"] - 0.1
    assert records[-1]["context_cosine"] < records[0]["context_cosine"]
    # The saved biLM is the plain architecture: no distillation weights in it.
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "run" / "model" / "model.safetensors"))
    assert not any("distill" in key for key in saved)


def test_a_pipeline_without_vectors_is_a_clear_error(tmp_path):
    spacy.blank("en").to_disk(tmp_path / "blank")
    with pytest.raises(ValueError, match="has no vectors"):
        StaticVectors.from_spacy(tmp_path / "blank")
