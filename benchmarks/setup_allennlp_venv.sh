#!/usr/bin/env bash
# Builds the benchmark-only virtual environment with AllenNLP 2.10.1 next to this project.
# AllenNLP is never a dependency of spacy-elmo: it lives in its own venv, outside the repo.
#
#   bash benchmarks/setup_allennlp_venv.sh [VENV_DIR]     # default ../bench-venv (beside the repository)
#
# Then: VENV_DIR/bin/python -m benchmarks.bench_bilm
set -euo pipefail

REPO_PARENT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${1:-${BENCH_VENV:-$REPO_PARENT/bench-venv}}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install --quiet)

# 1. CPU torch first, so that nothing below pulls a CUDA build.
#    (On a machine without a local CPU wheel, add --index-url https://download.pytorch.org/whl/cpu.)
"${PIP[@]}" "torch==2.13.0"

# 2. AllenNLP and the packages whose declared pins would replace torch: without dependencies.
"${PIP[@]}" --no-deps allennlp==2.10.1 cached-path==1.1.6 fairscale==0.4.6 torchvision==0.28.0

# 3. What AllenNLP's import chain (allennlp.modules.elmo) needs, with dependencies.
"${PIP[@]}" h5py spacy "transformers==4.49.0" "huggingface_hub<1" google-cloud-storage boto3 \
    lmdb dill base58 more-itertools safetensors typer tqdm requests filelock numpy scipy \
    scikit-learn nltk termcolor tensorboardX sentencepiece pillow "rich<13" jsonnet "torch==2.13.0" || {
    # jsonnet has no wheel for every Python; AllenNLP falls back to json without it.
    "${PIP[@]}" h5py spacy "transformers==4.49.0" "huggingface_hub<1" google-cloud-storage boto3 \
        lmdb dill base58 more-itertools safetensors typer tqdm requests filelock numpy scipy \
        scikit-learn nltk termcolor tensorboardX sentencepiece pillow "rich<13" "torch==2.13.0"
}

# 4. This project, without touching the packages above.
"${PIP[@]}" --no-deps -e "$REPO"

# 5. Check: AllenNLP's ELMo imports (torchvision's CUDA ops are declared as stubs first;
#    see benchmarks/allennlp_compat.py) and the torch build is still the CPU one.
cd "$REPO"
"$VENV/bin/python" - <<'PY'
from benchmarks import allennlp_compat  # noqa: F401  (declares torchvision::nms/qnms before allennlp imports)
import torch
from allennlp.modules.elmo import _ElmoBiLm, batch_to_ids  # noqa: F401
import allennlp, spacy_elmo
print(f"ok: torch {torch.__version__}, allennlp {allennlp.version.VERSION}, spacy_elmo {spacy_elmo.__version__}")
PY
