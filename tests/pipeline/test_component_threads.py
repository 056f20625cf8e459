"""The `elmo` component's torch threads: `util.threads.bilm_threads` of its `threads` setting,
worked out once per setting, torch count and process, and torch's count put back after."""

from __future__ import annotations

import spacy
import torch

from spacy_elmo.pipeline import component as component_module


def test_the_thread_count_is_worked_out_once_per_setting(monkeypatch):
    calls = []
    decide = component_module.bilm_threads

    def recorded(threads, **kwargs):
        calls.append((threads, kwargs))
        return decide(threads, **kwargs)

    monkeypatch.setattr(component_module, "bilm_threads", recorded)
    nlp = spacy.blank("en")
    elmo = nlp.add_pipe("elmo")
    before = torch.get_num_threads()
    nlp("The river bank")
    nlp("An investment bank")
    assert calls == [(None, {"training": False})]  # the CPU files read once
    elmo.cfg["threads"] = 1  # the config is the setting's store: read at each call
    nlp("The bank")
    assert calls == [(None, {"training": False}), (1, {"training": False})]
    assert torch.get_num_threads() == before  # one thread for the call, then torch's count
