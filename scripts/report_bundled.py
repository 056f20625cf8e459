"""Print the README table of the bundled biLM from its pretrain.json.

python scripts/report_bundled.py [spacy_elmo/data/en_elmo_bundled]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from spacy_elmo.loaders import BUNDLED_FILES, BUNDLED_MODEL


def main() -> None:
    directory = Path(sys.argv[1]) if len(sys.argv) > 1 else BUNDLED_MODEL
    s = json.loads((directory / "pretrain.json").read_text())
    cnn, lstm = s["options"]["char_cnn"], s["options"]["lstm"]
    held_out = s.get("held_out", {})
    stages = s.get("stages", [])
    size = sum((directory / f).stat().st_size for f in BUNDLED_FILES)
    rows = [
        ("architecture", f"char CNN {cnn['filters']} (F = {sum(n for _, n in cnn['filters'])}, "
         f"e = {cnn['embedding']['dim']}), {cnn['n_highway']} highway, {lstm['n_layers']} x "
         f"biLSTM D = {lstm['dim']}, P = {lstm['projection_dim']}, skip connections, clips "
         f"{lstm.get('cell_clip')}/{lstm.get('proj_clip')}; "
         f"output 3 x {2 * lstm['projection_dim']}"),
        ("parameters", f"{s['n_parameters']:,} biLM + adaptive softmax over "
         f"{s['vocab_size']:,} words"),
        ("files", f"{size / 1e6:.1f} MB (biLM, softmax, vocabulary)"),
        ("training data", "SOTU, nlp-corpus, Brown, linux-doc prose, World English Bible, Austen, "
         "Moby Dick, CoNLL-2003 train sentences (`scripts/fetch_assets.py`); 1% of lines held "
         "out"),
        ("data licences", "public domain (SOTU, World English Bible, Austen, Moby Dick), "
         "redistribution permitted (Brown), GPL-2 (linux-doc), scraped with no commercial "
         "republishing (nlp-corpus), Reuters RCV1 research licence (CoNLL-2003: its training "
         "sentences are read, not redistributed); none of the text ships in the package"),
        ("static vectors", "en_core_web_md 3.8.0 vectors (20k x 300, 684,830 keys; CC0) as "
         "auxiliary targets of the second stage (`--static-vectors`)" if stages else "none"),
        ("tokens seen", f"{s['tokens_seen']:,} ({s['steps']:,} steps)" + (
            " = " + " + ".join(f"{st['tokens_seen']:,}" for st in stages)
            + " (stage 1: language modelling; stage 2: + static-vector targets)"
            if stages else "")),
        ("training time", f"{s['train_seconds'] / 60:.0f} min" + (
            " = " + " + ".join(f"{st['train_seconds'] / 60:.0f}" for st in stages)
            + " (stage 1 on 2 threads, stage 2 on 1 thread beside other jobs)"
            if stages else f" on {s['world_size']} process(es), 2 CPU cores")),
        ("held-out perplexity", f"forward {held_out.get('ppl_forward', float('nan')):.1f}, "
         f"backward {held_out.get('ppl_backward', float('nan')):.1f}, average "
         f"{held_out.get('ppl', float('nan')):.1f} ({held_out.get('tokens', 0):,} tokens)"),
    ]  # fmt: skip
    print("| | |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")


if __name__ == "__main__":
    main()
