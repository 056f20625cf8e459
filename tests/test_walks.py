"""The package's main walks stay straight (`benchmarks/walks.py`): `embed` through at most 4
package files with at most 3 returns to a file left before, `BiLM.load` building one BiLM, and
`nlp(text)` through at most 8 files."""

from __future__ import annotations

import spacy

from benchmarks.walks import walk
from spacy_elmo import BiLM


def test_the_walks_go_straight():
    assert walk(lambda: BiLM.load("bundled"))["bilm_inits"] == 1
    bilm = BiLM.load("bundled")
    bilm.embed([["warm", "up"]])
    embed = walk(lambda: bilm.embed([["The", "cat", "sat", "."], ["Hello", "world"]]))
    assert embed["files"] <= 4 and embed["returns"] <= 3, embed["route"]
    nlp = spacy.blank("en")
    nlp.add_pipe("elmo")
    nlp("warm up the pipeline")
    pipeline = walk(lambda: nlp("The river bank overflowed after heavy rain"))
    assert pipeline["files"] <= 8, pipeline["route"]


def test_the_walk_counts_returns():
    """A file entered again after another counts as a return; calls within a file once."""
    from spacy_elmo.bilm import reference
    from spacy_elmo.description import chars

    def run():
        chars.batch_to_ids([["a"]])
        reference.token_ids("b")
        chars.batch_to_ids([["c"]])

    result = walk(run)
    assert result["route"] == ["description/chars.py", "bilm/reference.py", "description/chars.py"]
    assert (result["files"], result["returns"]) == (2, 1)
