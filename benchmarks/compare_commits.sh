#!/usr/bin/env bash
# Speed of two commits side by side in one run: bench_bilm (the small preset and the bundled
# biLM) and bench_pipeline (the elmo pipeline MODEL), BEFORE then AFTER in each of ROUNDS
# rounds, each commit from a worktree of its own (assets/ linked in), results in OUT; with
# CORPUS (tokenised text, one sentence a line) also bench_pretrain, the training step.
#   bash benchmarks/compare_commits.sh BEFORE AFTER MODEL [OUT] [ROUNDS] [CORPUS]
# MODEL: a trained elmo pipeline (e.g. training/evidence/elmo_1000_s0/model-best).
# ARCHS (environment; default small): bench_bilm's presets besides the bundled biLM.
# The table of before and after: python -m benchmarks.compare_summary OUT
set -euo pipefail
before=$1 after=$2 model=$(realpath "$3") out=${4:-benchmarks/results/compare_commits} rounds=${5:-3}
corpus=${6:+$(realpath "$6")}
repo=$(git rev-parse --show-toplevel)
work=$(mktemp -d)
trap 'for side in before after; do git -C "$repo" worktree remove --force "$work/$side"; done; rm -rf "$work"' EXIT
mkdir -p "$out"
out=$(realpath "$out")
for side in before after; do
    commit=$before; [ "$side" = after ] && commit=$after
    git -C "$repo" worktree add -q --detach "$work/$side" "$commit"
    ln -s "$repo/assets" "$work/$side/assets"
done
for round in $(seq "$rounds"); do
    for side in before after; do
        cd "$work/$side"
        PYTHONPATH=$PWD python -m benchmarks.bench_bilm --archs "${ARCHS:-small}" --bundled \
            --impls spacy-elmo-cpu --sentences 256 --threads 2 --cache-dir "$work/cache" \
            --output "$out/bilm_${side}_$round"
        PYTHONPATH=$PWD python -m benchmarks.bench_pipeline --pipelines elmo \
            --model "elmo=$model" --threads 2 --rounds 1 --passes 2 --latency-sentences 200 \
            --output "$out/pipeline_${side}_$round" --plot "$out/pipeline_${side}_$round.png"
        if [ -n "$corpus" ]; then
            PYTHONPATH=$PWD python -m benchmarks.bench_pretrain "$corpus" --threads 1 \
                --output "$out/pretrain_${side}_$round"
        fi
    done
done
