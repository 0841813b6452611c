#!/usr/bin/env bash
# bash benchmarks/gpu_check.sh [OPTIONS]     # on a CUDA machine: 2-4 minutes, under 8 by construction
# Issue 56's GPU check in one command: benchmarks/gpu_check.py under `timeout`. OPTIONS go to it (e.g.
# --checks train rollout; --device cpu --quick runs the code paths on a CPU). Writes gpu_check.json,
# gpu_check.log, install.log and each check's NAME.log under $OUT (default /tmp/gpu_check); exits 1 when a
# case failed, 124 when the whole run passed its time limit. One line per case, PASS/FAIL/SKIP [reason]:
#   train/MODEL/PRECISION   `grpo train precision=...` (conf/precision/*.yaml), 4 steps in-process, MODEL tiny
#       (the default) or llama27m (random-init, 8 layers of 512): loss_last, grad_norm_max (finite ones),
#       skipped_updates (fp16's scaler), weights_moved_rel (|w_end - w_start| / |w_start|), step_s_median
#       (steps 2-4), peak_mib, the rollout loop and sampling weights the trainer chose. FAIL: a loss not
#       finite, no grad_norm > 0, weights unmoved. fp16 on a CPU: SKIP (the trainer runs fp32 there).
#   rollout/MODEL/WEIGHTS/LOOP   the trainer's generator (make_generator + with_sampling_weights) for
#       rollout.loop=generate | auto | fast on WEIGHTS fp32 (the policy) or bf16 (rollout.sampling_weights=
#       bf16; generate runs the same SamplingCopy), 16 prompts x 16 completions of 64 tokens: decode (generate |
#       fixed-shape | model forward), us_per_token (median of 3 timed calls per completion token, us_range
#       their range), logp_mean (per token, scored by the fp32 policy), len_mean, copy_gap (mean |copy -
#       policy| log-prob of the copy's samples), greedy_equal (fp32: completions equal to generate's;
#       greedy_near_ties: first differences where the two tokens' logits are within 1e-3), logp_vs_generate
#       and length_vs_generate (mean per-prompt difference, and its bound: 4 standard errors + a floor).
#       FAIL: auto not on the fixed-shape decode (or fast not on the forward), a greedy difference that is
#       no near-tie, a sampled mean past its bound.
#   vllm/train+push/DTYPE   where vLLM imports (SKIP otherwise): 3 steps of rollout.backend=vllm, engine_gap_max
#       (rollout/engine_gap), then on a fixed sequence: gap_synced (engine vs policy after a push),
#       engine_before_push (engine's move after an unpushed update: 0), gap_stale, gap_pushed (after the
#       push), push_s. FAIL: a gap past `tolerance` (fp32 1e-3, bf16 0.05), or gap_stale <= 0.1.
#
# grpo-cli need not be installed: where `grpo_cli.conf` cannot be imported, the tree is installed with
# --no-deps into /tmp/site (no network), with the wheels in .whl/ first: the ones a CUDA image with torch
# and transformers lacks (benchmarks/async_pipeline_gpu.sh does the same). Fetch them once, here, on a
# machine with the network, then carry .whl to the GPU machine (the run tool's carry: [".whl"]):
#   bash benchmarks/gpu_check.sh --fetch-wheels   # hydra-core, omegaconf, antlr4 into .whl/ (git ignores it)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

if [ "${1:-}" = "--fetch-wheels" ]; then
    mkdir -p .whl
    "$PY" -m pip wheel -q --no-deps -w .whl hydra-core==1.3.8 omegaconf==2.3.1 antlr4-python3-runtime==4.9.3
    if [ -d .git/info ] && ! grep -qxF '/.whl/' .git/info/exclude 2>/dev/null; then
        echo '/.whl/' >>.git/info/exclude  # local to this checkout: .whl never shows in git status
    fi
    ls -l .whl
    exit 0
fi

OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
start=$SECONDS

if ! "$PY" -c "import importlib.resources as r, hydra, omegaconf; r.files('grpo_cli.conf')" 2>/dev/null; then
    mkdir -p /tmp/site
    {  # setuptools' build notices go to OUT/install.log, not the run's output
        if compgen -G ".whl/*" >/dev/null; then
            "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site .whl/*
        fi
        "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site .
    } >"$OUT/install.log" 2>&1 || { tail -20 "$OUT/install.log"; exit 1; }
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    echo "gpu_check.sh: grpo-cli and the wheels in .whl/ installed into /tmp/site"
fi
"$PY" - <<'EOF' || exit 1
import torch
import grpo_cli.training  # noqa: F401  (hydra, omegaconf and the package itself)
gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
print(f"gpu_check.sh: torch {torch.__version__} (CUDA {torch.version.cuda}), {gpu}")
EOF
nvidia-smi -L 2>/dev/null || true
echo "gpu_check.sh: ready after $((SECONDS - start)) s"

# the install above takes seconds; the checks 450 s at most (gpu_check.py keeps its own total to 440 s): < 8 min
set +e
timeout 450 "$PY" benchmarks/gpu_check.py --out "$OUT" "$@" 2>&1 | tee "$OUT/gpu_check.log"
status=${PIPESTATUS[0]}
echo "gpu_check.sh: $((SECONDS - start)) s in all, exit $status" | tee -a "$OUT/gpu_check.log"
exit "$status"
