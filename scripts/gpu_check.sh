#!/usr/bin/env bash
# The CUDA path on a machine with an NVIDIA GPU, in one command: the CUDA tests (copies against
# a reference, pinned chunks, stream ordering, compute never blocked, real CUDA KV layouts,
# the bundled engine on cuda with CPU, CPU + disk and CPU + fs tiers, layer-wise loads on per-layer
# CUDA events in every load mode), `kvoffload bench transfer` on the GPU, and `kvoffload bench
# serve` on the bundled engine on the GPU at low load (layer-wise against asynchronous loads).
# Writes a short results file (default gpu_results.txt); exit status 1 if a test failed.
#   bash scripts/gpu_check.sh [results-file]        PYTHON=... picks the interpreter
#   TRANSFER=0 / SERVE=0 skip that benchmark
set -uo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-gpu_results.txt}")
py=${PYTHON:-python3}
if ! "$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "error: $py sees no CUDA device (torch.cuda.is_available() is False); run this on a GPU machine" >&2
    exit 2
fi
if ! "$py" -c "import kvoffload" 2>/dev/null; then
    echo "error: kvoffload is not importable by $py; pip install -e . first (or set PYTHON)" >&2
    exit 2
fi
{
    echo "# kvoffload CUDA check $(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.max,pcie.link.width.max --format=csv 2>/dev/null
    "$py" - <<'PY'
import importlib.util, platform, torch
cupy = "not installed"
if importlib.util.find_spec("cupy"):
    import cupy as cp
    cupy = f"{cp.__version__} (CUDA runtime {cp.cuda.runtime.runtimeGetVersion()})"
print(f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}), cupy {cupy}")
PY
} > "$out"
log=$(mktemp)
"$py" -m pytest -q -p no:cacheprovider -m cuda tests/cuda tests/transfer -rfs 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
{
    echo
    echo "## CUDA tests (pytest -m cuda tests/cuda tests/transfer): exit $status"
    grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed" "$log" | tail -n 40
} >> "$out"
if [ "${TRANSFER:-1}" != 0 ]; then
    printf '\n## kvoffload bench transfer --device cuda\n' >> "$out"
    "$py" -m kvoffload bench transfer --device cuda --reps 5 2>&1 | tee -a "$out"
fi
if [ "${SERVE:-1}" != 0 ]; then
    # Low load on the GPU: one conversation (the README's one-client row), and one client
    # asking about 8 documents of which the device cache holds 2 (every other request a hit).
    for workload in "chat --conversations 1 --turns 12" "rag --clients 1 --requests 32"; do
        cmd="kvoffload bench serve --engine bundled --device cuda --workload $workload --configs plain,cpu:async,cpu --also-vs cpu:async --reps 3"
        printf '\n## %s\n' "$cmd" >> "$out"
        # shellcheck disable=SC2086
        "$py" -m $cmd 2>&1 | grep -v "requests:" | tee -a "$out"
    done
fi
rm -f "$log"
echo "results: $out"
[ "$status" -eq 0 ] || exit 1
