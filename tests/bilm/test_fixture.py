"""Exactness against the outputs of the original TensorFlow biLM (docs/MODEL.md §11)."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

from spacy_elmo import batch_to_ids

from .util import fixture_bilm, fixture_sentences, fixture_top_layer

TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def sentences(allennlp_fixture):
    return fixture_sentences(allennlp_fixture)


def test_stateful_batches_of_three_reproduce_the_fixture(allennlp_fixture, sentences):
    bilm = fixture_bilm(allennlp_fixture, stateful=True)
    worst = 0.0
    for i in range(10):
        batch = [sentences[k][i] for k in range(3)]
        outputs = bilm.embed(batch, batch_size=3)
        for k in range(3):
            assert outputs[k].shape == (3, len(batch[k]), 32)
            diff = np.abs(outputs[k][2] - fixture_top_layer(allennlp_fixture, k, i)).max()
            worst = max(worst, float(diff))
    assert worst <= TOLERANCE


def test_stateless_mode_matches_only_the_first_fixture_batch(allennlp_fixture, sentences):
    """The fixture needs carried state: batch 0 starts from zeros, later batches do not."""
    bilm = fixture_bilm(allennlp_fixture)
    first = bilm.embed([sentences[k][0] for k in range(3)])
    for k in range(3):
        np.testing.assert_allclose(
            first[k][2], fixture_top_layer(allennlp_fixture, k, 0), atol=TOLERANCE, rtol=0
        )
    later = bilm.embed([sentences[k][1] for k in range(3)])
    diffs = [
        np.abs(later[k][2] - fixture_top_layer(allennlp_fixture, k, 1)).max() for k in range(3)
    ]
    assert max(diffs) > 1e-2


def test_reset_states_equals_a_fresh_model(allennlp_fixture, sentences):
    bilm = fixture_bilm(allennlp_fixture, stateful=True)
    bilm.token_cache_size = 0  # bitwise comparison: every token vector computed in this batch
    bilm.embed([sentences[k][0] for k in range(3)])
    carried = bilm.embed([sentences[k][1] for k in range(3)])
    bilm.reset_states()
    reset = bilm.embed([sentences[k][1] for k in range(3)])
    fresh_bilm = fixture_bilm(allennlp_fixture, stateful=True)
    fresh_bilm.token_cache_size = 0
    fresh = fresh_bilm.embed([sentences[k][1] for k in range(3)])
    for a, b, c in zip(carried, reset, fresh):
        np.testing.assert_array_equal(b, c)
        assert np.abs(a[1:] - b[1:]).max() > 1e-2
        np.testing.assert_allclose(a[0], b[0], atol=TOLERANCE, rtol=0)  # layer 0 is stateless


def test_stateful_rows_beyond_a_smaller_batch_keep_their_state(allennlp_fixture, sentences):
    """A batch of 1 after a batch of 3 leaves rows 1 and 2 as they were (docs/MODEL.md §8)."""
    a = fixture_bilm(allennlp_fixture, stateful=True)
    b = fixture_bilm(allennlp_fixture, stateful=True)
    a.embed([sentences[k][0] for k in range(3)])
    b.embed([sentences[k][0] for k in range(3)])
    a.embed([sentences[0][1]])  # touches row 0 only
    after_a = a.embed([sentences[k][2] for k in range(3)])
    b.embed([sentences[0][1], sentences[1][5], sentences[2][5]])  # touches all rows
    after_b = b.embed([sentences[k][2] for k in range(3)])
    np.testing.assert_allclose(after_a[0], after_b[0], atol=TOLERANCE, rtol=0)
    assert np.abs(after_a[1][1:] - after_b[1][1:]).max() > 1e-3


def test_char_cnn_reproduces_the_token_embeddings(allennlp_fixture):
    vocab = (allennlp_fixture / "vocab_test.txt").read_text(encoding="utf-8").split("\n")
    assert len(vocab) == 458
    with h5py.File(allennlp_fixture / "elmo_token_embeddings.hdf5", "r") as f:
        expected = f["embedding"][...]
    bilm = fixture_bilm(allennlp_fixture)
    with torch.no_grad():
        vectors = bilm.token_embeddings(batch_to_ids([vocab]))[0].numpy()
    np.testing.assert_allclose(vectors, expected, atol=TOLERANCE, rtol=0)
    # The same vectors come out as layer 0 of `embed`, duplicated to 2P.
    layer0 = np.concatenate(
        [x[0] for x in bilm.embed([vocab[i : i + 50] for i in range(0, 458, 50)])]
    )
    np.testing.assert_allclose(layer0[:, :16], expected, atol=TOLERANCE, rtol=0)
    np.testing.assert_array_equal(layer0[:, :16], layer0[:, 16:])


def test_literal_boundary_tokens_equal_the_added_boundaries(allennlp_fixture):
    bilm = fixture_bilm(allennlp_fixture)
    with torch.no_grad():
        acts = bilm.activations(batch_to_ids([["<S>", "hello", "</S>"]]))
    tokens = acts.token_embeddings[0]  # (<S>, <S>, hello, </S>, </S>)
    torch.testing.assert_close(tokens[1], tokens[0], atol=0, rtol=0)
    torch.testing.assert_close(tokens[3], tokens[4], atol=0, rtol=0)
    assert not torch.equal(tokens[0], tokens[4])
