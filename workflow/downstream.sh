#!/usr/bin/env bash
# The components with a fine-tuned bundled biLM, against the elmo pipeline of the learning
# curves (`spacy project run evidence-downstream`; results/downstream/README.md). ELMo at the
# encoder's output and dropout on ELMo, the other variants of that page, ran with
# spacy_elmo.ElmoTok2Vec.v2, retired after commit c6ee26c (docs/research/downstream.md). Each variant's
# runs go in training/downstream/VARIANT (finished runs are kept), the baseline runs of the
# evidence workflow with the same seeds are linked in, and the report goes to results/downstream/;
# so does the same report of the evidence workflow's elmo runs of those seeds (reference).
# Needs the evidence workflow's corpus, subsets and baseline runs (seeds 0-2 at 1,000, 0-1 at all).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
declare -A SETTINGS=([fine_tune]="--set components.elmo.model.frozen=false")
declare -A FULL_SEEDS=([fine_tune]="0")
mkdir -p results/downstream
# the reference: the evidence workflow's own elmo runs (frozen, ELMo at the input) of the same
# seeds, linked in and reported alike
reference=training/downstream/reference
mkdir -p "$reference"
for run in elmo_1000_s0 elmo_1000_s1 elmo_1000_s2 elmo_all_s0 elmo_all_s1 \
    baseline_1000_s0 baseline_1000_s1 baseline_1000_s2 baseline_all_s0 baseline_all_s1; do
    ln -sfn "../../evidence/$run" "$reference/$run"
done
python -m workflow.evidence report --root "$reference" --bilm-name "the bundled biLM" \
    --json results/downstream/reference.json --markdown results/downstream/reference.md \
    --plot results/downstream/reference.png
for variant in fine_tune; do
    root="training/downstream/$variant"
    # shellcheck disable=SC2086  # the settings and seeds are lists of words
    python -m workflow.evidence runs --pipelines elmo --sizes 1000 all --seeds 0 1 2 \
        --full-seeds ${FULL_SEEDS[$variant]} --root "$root" ${SETTINGS[$variant]}
    for run in baseline_1000_s0 baseline_1000_s1 baseline_1000_s2; do
        ln -sfn "../../evidence/$run" "$root/$run"
    done
    for seed in ${FULL_SEEDS[$variant]}; do
        ln -sfn "../../evidence/baseline_all_s$seed" "$root/baseline_all_s$seed"
    done
    python -m workflow.evidence report --root "$root" --bilm-name "the bundled biLM" \
        --json "results/downstream/$variant.json" --markdown "results/downstream/$variant.md" \
        --plot "results/downstream/$variant.png"
done
