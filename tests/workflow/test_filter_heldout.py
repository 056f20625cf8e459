"""workflow/filter_heldout.py: held-out sentences that a later stage has not read."""

from workflow import filter_heldout


def test_sentences_of_excluded_raw_lines_are_dropped_and_the_rest_kept_in_order():
    raw = ["EU rejects German call . Peter Blackburn", "The river bank flooded ."]
    tokenised = ["EU rejects German call .", "Peter Blackburn", "The river bank flooded ."]
    excluded = {"EU rejects German call . Peter Blackburn", "a line not held out"}
    kept, dropped = filter_heldout.held_out_without(tokenised, raw, excluded)
    assert kept == ["The river bank flooded ."]
    assert dropped == ["EU rejects German call .", "Peter Blackburn"]


def test_nothing_is_dropped_when_no_held_out_line_was_read_later():
    kept, dropped = filter_heldout.held_out_without(["a b ."], ["a b ."], {"c d ."})
    assert (kept, dropped) == (["a b ."], [])
