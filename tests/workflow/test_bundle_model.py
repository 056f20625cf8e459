"""workflow/bundle_model.py: the stages and totals of a bundled model's card."""

from workflow import bundle_model


def stage(steps, tokens, seconds):
    return {"steps": steps, "tokens_seen": tokens, "train_seconds": seconds, "world_size": 1}


def test_a_second_stage_adds_to_the_first():
    first = {**stage(4500, 8_000, 100.0), "dev_ppl": 165.0}
    summary = bundle_model.with_first_stage({**stage(3000, 5_000, 50.5), "dev_ppl": 144.0}, first)
    assert summary["stages"] == [stage(4500, 8_000, 100.0), stage(3000, 5_000, 50.5)]
    assert (summary["steps"], summary["tokens_seen"]) == (7500, 13_000)
    assert summary["train_seconds"] == 150.5
    assert summary["dev_ppl"] == 144.0  # the figures of the model itself stay its own


def test_a_bundled_card_with_stages_continues_its_list():
    card = bundle_model.with_first_stage(stage(3000, 5_000, 50.0), stage(4500, 8_000, 100.0))
    summary = bundle_model.with_first_stage(stage(2400, 4_000, 40.0), card)
    assert [s["steps"] for s in summary["stages"]] == [4500, 3000, 2400]
    assert (summary["steps"], summary["tokens_seen"], summary["train_seconds"]) == (
        9900,
        17_000,
        190.0,
    )
