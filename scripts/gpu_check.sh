#!/usr/bin/env bash
# The CUDA path on a machine with an NVIDIA GPU, in one command (sections time-boxed, so one that
# hangs costs its own box only; each writes to the results file as it goes):
#   1. the CUDA tests (copy methods and the copy plan against a reference, pinned chunks, stream
#      ordering, compute never blocked, CUDA KV layouts, step timing on the device, the bundled
#      engine on cuda with every tier and load mode, layer-wise loads on per-layer events);
#   2. `kvoffload bench transfer --device cuda`: each direction, both at once, the copy plan,
#      the SMs the kernel holds and a matmul loop's slowdown beside the copies;
#   3. scripts/host_profile.py: where a returning chat turn's host time goes (connector share);
#   4. `kvoffload bench serve` on the bundled engine on the GPU: the tiny 8-layer model's chat
#      (plain, asynchronous loads, auto) and a Llama-3-8B-shaped bf16 model's (plain, auto).
# Writes the results file (default gpu_results.txt); exit status 1 if a test failed.
#   bash scripts/gpu_check.sh [results-file]     PYTHON=... picks the interpreter
#   TESTS=0 / TRANSFER=0 / PROFILE=0 / SERVE=0 / SERVE8B=0 skip a section; TESTS_S=... its time box
#   BEFORE=dir: profile the tree there too (e.g. git archive of an earlier commit)
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
section() { printf '\n## %s\n' "$1" | tee -a "$out"; }
{
    echo "# kvoffload CUDA check $(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.max,pcie.link.width.max --format=csv 2>/dev/null
    "$py" - <<'PY'
import importlib.util, platform, torch
cupy = "not installed"
if importlib.util.find_spec("cupy"):
    import cupy as cp
    cupy = f"{cp.__version__} (CUDA runtime {cp.cuda.runtime.runtimeGetVersion()})"
from kvoffload_ext.copies.batch_memcpy import unavailable_reason
batch = unavailable_reason() or "available"
print(f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}), cupy {cupy}, "
      f"cuMemcpyBatchAsync {batch}")
PY
} > "$out" 2>&1
cat "$out"
status=0
if [ "${TESTS:-1}" != 0 ]; then
    section "CUDA tests (pytest -m cuda tests/cuda tests/transfer)"
    log=$(mktemp)
    timeout "${TESTS_S:-200}" "$py" -m pytest -q -p no:cacheprovider -m cuda tests/cuda tests/transfer -rfs -s \
        2>&1 | tee "$log"
    status=${PIPESTATUS[0]}
    { echo "exit $status"; grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed|rows (device|host)" "$log" | tail -n 60; } >> "$out"
    rm -f "$log"
fi
if [ "${TRANSFER:-1}" != 0 ]; then
    section "kvoffload bench transfer --device cuda --total-mib 512 --reps 3"
    timeout "${TRANSFER_S:-150}" "$py" -m kvoffload bench transfer --device cuda --total-mib 512 --reps 3 2>&1 | tee -a "$out"
fi
if [ "${PROFILE:-1}" != 0 ]; then
    section "scripts/host_profile.py --device cuda (8 conversations, 3 rounds; cProfile of the main thread)"
    timeout "${PROFILE_S:-90}" "$py" scripts/host_profile.py --device cuda --rounds 3 2>&1 | tee -a "$out"
    if [ -n "${BEFORE:-}" ]; then  # the same profile of an earlier tree (BEFORE=dir holding its packages)
        section "the same on the tree in $BEFORE (before)"
        PYTHONPATH="$BEFORE" timeout "${PROFILE_S:-90}" "$py" scripts/host_profile.py --device cuda --rounds 3 \
            --configs cpu:async,cpu 2>&1 | tee -a "$out"
    fi
fi
if [ "${SERVE:-1}" != 0 ]; then
    cmd="kvoffload bench serve --engine bundled --device cuda --workload chat --conversations 12 --configs plain,cpu:async,cpu --reps 2"
    section "$cmd (the tiny 8-layer model)"
    # shellcheck disable=SC2086
    timeout "${SERVE_S:-120}" "$py" -m $cmd 2>&1 | grep -v "requests:" | tee -a "$out"
fi
if [ "${SERVE8B:-1}" != 0 ]; then
    cmd="kvoffload bench serve --engine bundled --device cuda --workload chat --conversations 4 --turns 4 --context 4096 --configs plain,cpu --reps 2 --layers 32 --hidden 4096 --heads 32 --kv-heads 8 --intermediate 14336 --vocab 128256 --dtype bfloat16 --cpu 6GiB"
    section "$cmd (Llama-3-8B-shaped, random weights)"
    # shellcheck disable=SC2086
    timeout "${SERVE8B_S:-150}" "$py" -m $cmd 2>&1 | grep -v "requests:" | tee -a "$out"
fi
echo "results: $out"
[ "$status" -eq 0 ] || exit 1
