"""Print the README table of the CoNLL-2003 runs (`spacy project run conll`).

python -m workflow.report_conll [training]

Reads `training/conll_{baseline,elmo}/test.json` (written by `spacy evaluate`) and the learned
layer mix of every component of `training/conll_elmo/model-best`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RUNS = {"baseline": "tagger + ner, no ELMo", "elmo": "tagger + ner, each with its own ELMo mix"}


def main() -> None:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("training")
    print(
        "| pipeline | dev ENTS_F (best) | test TAG_ACC | test ENTS_F | test ENTS_P | test ENTS_R |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for run, label in RUNS.items():
        test = json.loads((root / f"conll_{run}" / "test.json").read_text())
        meta = json.loads((root / f"conll_{run}" / "model-best" / "meta.json").read_text())
        dev = meta.get("performance", {}).get("ents_f")
        print(
            f"| {label} | {100 * dev:.2f} | {100 * test['tag_acc']:.2f} "
            f"| {100 * test['ents_f']:.2f} | {100 * test['ents_p']:.2f} "
            f"| {100 * test['ents_r']:.2f} |"
        )
    import spacy

    from spacy_elmo.layers.scalar_mix import softmax_weights_and_gamma

    nlp = spacy.load(root / "conll_elmo" / "model-best")
    print()
    print("| component | s (layer 0, 1, 2) | gamma |")
    print("|---|---|---:|")
    for name, component in nlp.pipeline:
        model = getattr(component, "model", None)
        if model is None:
            continue
        for node in model.walk():
            if node.name == "scalar_mix":
                weights, gamma = softmax_weights_and_gamma(node)
                shown = ", ".join(f"{w:.3f}" for w in weights)
                print(f"| {name} | {shown} | {gamma:.3f} |")


if __name__ == "__main__":
    main()
