"""A run that does not fit in memory fails before training (`spacy_elmo.pretrain.objective`)."""

from __future__ import annotations

import pytest
import torch

from spacy_elmo.bilm import BiLMOptions
from spacy_elmo.pretrain import pretrain
from spacy_elmo.pretrain.objective import check_memory, estimate_memory_bytes
from spacy_elmo.pretrain.presets import preset

from .test_pretrain import tiny_config, write_corpus


def test_too_large_architecture_fails_early(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.txt")
    with pytest.raises(ValueError, match="needs about .* GiB but only 1.0 GiB"):
        pretrain(tiny_config(tmp_path, corpus, preset="original", max_memory_gb=1.0))
    assert not (tmp_path / "run" / "checkpoints" / "last.pt").exists()


def test_the_limit_is_the_estimate(tmp_path):
    """A limit just above the estimate passes, one just below it is refused."""
    options = BiLMOptions.from_dict(preset("tiny"))
    config = tiny_config(tmp_path, tmp_path / "corpus.txt")
    need = estimate_memory_bytes(options, 100, config.batch_tokens)
    # the weights, their gradients and Adam's two moments in float32 at least
    assert need > options.n_parameters() * 4 * 4
    cpu = torch.device("cpu")
    for limit, fits in [(need + 2**20, True), (need - 2**20, False)]:
        limited = tiny_config(tmp_path, tmp_path / "corpus.txt", max_memory_gb=limit / 2**30)
        if fits:
            check_memory(limited, options, 100, cpu)
        else:
            with pytest.raises(ValueError, match=f"batch_tokens={config.batch_tokens} needs"):
                check_memory(limited, options, 100, cpu)
