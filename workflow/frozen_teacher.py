"""The frozen teacher as features: all-MiniLM-L6-v2, not fine-tuned, under the learning curves'
tagger and NER, to set beside the biLM that was taught by it.

The transformer pipeline's config (configs/ner_tagger_transformer.cfg) with its transformer
frozen and annotating (its listeners read `doc._.trf_data`), and the optimiser of the
frozen-feature pipelines (Adam at a constant 1e-3, as configs/ner_tagger_elmo.cfg; the
transformer config's 5e-5 warm-up is a fine-tuning rate, at which heads trained from scratch
over frozen features barely move in 1,000 steps). A frozen component is not initialised by
`spacy train`, so the transformer is initialised once here, saved, and sourced by the config:

    python -m workflow.frozen_teacher training/frozen_teacher

writes training/frozen_teacher/base (the initialised pipeline) and
training/frozen_teacher/frozen.cfg; `spacy project run evidence-frozen-teacher` trains and
scores it with the evidence runs' data, seed and step budget.
"""

from __future__ import annotations

import argparse
from pathlib import Path

TRANSFORMER_CONFIG = Path("configs/ner_tagger_transformer.cfg")
FROZEN_LEARN_RATE = 0.001  # configs/ner_tagger_elmo.cfg's
INIT_EXAMPLES = 50  # enough for the labels; the transformer's weights are the asset's


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path, help="folder for base/ and frozen.cfg")
    parser.add_argument("--train", type=Path, default=Path("corpus/conll/train.spacy"))
    args = parser.parse_args(argv)

    import spacy
    from spacy.training import Corpus
    from spacy.util import load_config

    paths = {"paths.train": str(args.train), "paths.dev": str(args.train)}
    config = load_config(TRANSFORMER_CONFIG, overrides=paths, interpolate=True)
    nlp = spacy.util.load_model_from_config(config, auto_fill=True, validate=True)
    examples = list(Corpus(str(args.train))(nlp))[:INIT_EXAMPLES]
    nlp.initialize(lambda: examples)
    args.output.mkdir(parents=True, exist_ok=True)
    base = args.output / "base"
    nlp.to_disk(base)

    frozen = load_config(TRANSFORMER_CONFIG, interpolate=False)
    frozen["components"]["transformer"] = {"source": str(base)}
    frozen["training"]["frozen_components"] = ["transformer"]
    frozen["training"]["annotating_components"] = ["transformer"]
    frozen["training"]["optimizer"]["learn_rate"] = FROZEN_LEARN_RATE
    frozen.to_disk(args.output / "frozen.cfg")
    print(f"wrote {base} and {args.output / 'frozen.cfg'}")


if __name__ == "__main__":
    main()
