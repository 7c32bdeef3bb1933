#!/usr/bin/env bash
# The prepared GPU check of the rollout engines (docs/vllm.md), offline, in under 8 minutes on one GPU:
#   1. the engine conformance suite and the vLLM tests, vLLM on CUDA (tests/test_engine_conformance.py,
#      tests/test_vllm_engine.py, tests/test_vllm_training.py);
#   2. a 20-step run of the default task with each engine (torch, hf, vllm) on a locally built ~100M-parameter
#      tiny model (16 layers, hidden 768), bf16, sharing one model cache;
#   2b. the same run with LoRA adapters (rank 16; vLLM gets them merged into its weights), on vLLM where installed;
#   2c. the torch-engine run on 2 processes with torchrun, trainer.strategy=ddp and fsdp2 (NCCL, one GPU each;
#      skipped, saying so, with fewer than 2 GPUs; gloo in the CPU mode);
#   2d. one step off (experiment=async): the next rollout, on vLLM where installed, while the step updates;
#   3. each run's rollout throughput (sampled tokens per second of rollout) and step time.
#
#   bash experiments/gpu_check.sh [OUT_DIR]      # in an environment with minirl installed, .[vllm] for vLLM
#
# Where vLLM is not installed it says so and checks the other engines. Never part of CI (no GPU there).
# GPU_CHECK_DEVICE=cpu GPU_CHECK_MODEL="..." GPU_CHECK_STEPS=2 run the same script on CPU with a small model.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-outputs/gpu_check}
PY=${PYTHON:-python}
DEVICE=${GPU_CHECK_DEVICE:-cuda}
STEPS=${GPU_CHECK_STEPS:-20}
MODEL=${GPU_CHECK_MODEL:-"model.dtype=bfloat16 model.tiny.hidden_size=768 model.tiny.num_layers=16 model.tiny.num_heads=12 model.tiny.num_kv_heads=4 model.tiny.intermediate_size=2048 model.tiny.copy_pretrain_steps=200 sft.rows=600 sft.epochs=2"}
mkdir -p "$OUT"
export WANDB_MODE=offline HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
status=0
started=$SECONDS

echo "== environment"
$PY - <<'EOF'
import importlib.util, torch, transformers
print("torch", torch.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")
print("transformers", transformers.__version__)
if importlib.util.find_spec("vllm"):
    import vllm
    print("vllm", vllm.__version__)
else:
    print("vllm NOT INSTALLED: its conformance cases, tests and run are skipped (pip install -e '.[vllm]')")
EOF
HAVE_VLLM=$($PY -c "import importlib.util; print(int(importlib.util.find_spec('vllm') is not None))")

echo "== 1. conformance suite and vLLM tests"
t=$SECONDS
$PY -m pytest -q -p no:cacheprovider -rs tests/test_engine_conformance.py tests/test_vllm_engine.py \
    tests/test_vllm_training.py > "$OUT/conformance.log" 2>&1
rc=$?
grep -E "^(FAILED|ERROR|SKIPPED)|[0-9]+ (passed|failed)" "$OUT/conformance.log"
[ $rc = 0 ] || status=1
echo "   exit $rc after $((SECONDS - t)) s (log $OUT/conformance.log)"

echo "== 2. $STEPS steps per engine, one model cache"
engines="torch hf"
[ "$HAVE_VLLM" = 1 ] && engines="$engines vllm"
for engine in $engines; do
    t=$SECONDS
    # shellcheck disable=SC2086  # MODEL is a list of overrides
    $PY -m minirl.train rollout.engine=$engine trainer.device=$DEVICE trainer.steps=$STEPS trainer.eval_every=$STEPS \
        rollout.gpu_memory_utilization=0.3 rollout.sync_check_every=$(( STEPS < 5 ? 1 : 5 )) logger=none $MODEL \
        model.cache_dir="$OUT/cache" hydra.run.dir="$OUT/run_$engine" > "$OUT/run_$engine.log" 2>&1
    rc=$?
    [ $rc = 0 ] || status=1
    echo "   $engine: exit $rc after $((SECONDS - t)) s (log $OUT/run_$engine.log)"
done

echo "== 2b. LoRA: rank-16 adapters alone trained, the reference the adapters-off policy, the sampler merged weights"
lora_engine=$([ "$HAVE_VLLM" = 1 ] && echo vllm || echo torch)
t=$SECONDS
# shellcheck disable=SC2086
$PY -m minirl.train rollout.engine=$lora_engine trainer.device=$DEVICE trainer.steps=$STEPS trainer.eval_every=$STEPS \
    rollout.gpu_memory_utilization=0.3 rollout.sync_check_every=$(( STEPS < 5 ? 1 : 5 )) logger=none $MODEL \
    model.lora.r=16 model.lora.alpha=32 trainer.lr=3e-3 model.cache_dir="$OUT/cache" hydra.run.dir="$OUT/run_lora" \
    > "$OUT/run_lora.log" 2>&1
rc=$?
[ $rc = 0 ] || status=1
echo "   lora ($lora_engine): exit $rc after $((SECONDS - t)) s (log $OUT/run_lora.log)"

echo "== 2c. 2 processes under torchrun: ddp and fsdp2 (experimental), the torch engine"
parallel=""
GPUS=$($PY -c "import torch; print(torch.cuda.device_count())")
if [ "$DEVICE" = cpu ] || [ "$GPUS" -ge 2 ]; then
    for strategy in ddp fsdp2; do
        t=$SECONDS
        # shellcheck disable=SC2086
        $PY -m torch.distributed.run --standalone --nproc_per_node 2 -m minirl.train trainer.strategy=$strategy \
            trainer.device=$DEVICE trainer.steps=$STEPS trainer.eval_every=$STEPS logger=none $MODEL \
            model.cache_dir="$OUT/cache" hydra.run.dir="$OUT/run_$strategy" > "$OUT/run_$strategy.log" 2>&1
        rc=$?
        [ $rc = 0 ] || status=1
        parallel="$parallel $strategy"
        echo "   $strategy: exit $rc after $((SECONDS - t)) s (log $OUT/run_$strategy.log)"
    done
else
    echo "   skipped: $GPUS GPU(s) here, 2 needed"
fi

echo "== 2d. one step off: the next step's rollout on a worker thread while this step updates"
async_engine=$([ "$HAVE_VLLM" = 1 ] && echo vllm || echo torch)
t=$SECONDS
# shellcheck disable=SC2086
$PY -m minirl.train experiment=async rollout.engine=$async_engine trainer.device=$DEVICE trainer.steps=$STEPS \
    trainer.eval_every=$STEPS rollout.gpu_memory_utilization=0.3 logger=none $MODEL model.cache_dir="$OUT/cache" \
    hydra.run.dir="$OUT/run_async" > "$OUT/run_async.log" 2>&1
rc=$?
[ $rc = 0 ] || status=1
echo "   async ($async_engine): exit $rc after $((SECONDS - t)) s (log $OUT/run_async.log; compare its step s with $async_engine's)"

echo "== 3. throughput"
# shellcheck disable=SC2086
$PY - "$OUT" $engines lora $parallel async <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
print(f"{'engine':<7} {'held-out 0 -> end':<18} {'step s':>7} {'rollout s':>9} {'tokens/s':>9} {'sync gap (max)':>14} {'stale':>5}")
for engine in sys.argv[2:]:
    path = out / f"run_{engine}" / "metrics.jsonl"
    if not path.exists():
        print(f"{engine:<7} no metrics: see {out}/run_{engine}.log")
        continue
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    steps = [r for r in rows if "time/step_s" in r][1:]  # the first step warms up (compilation, caches)
    evals = [r["eval/success_rate"] for r in rows if "eval/success_rate" in r]
    sampled = sum(r["rollout/sampled_tokens"] for r in steps)
    rollout_s = sum(r["time/rollout_s"] for r in steps)
    gaps = [r["rollout/sync_gap"] for r in rows if "rollout/sync_gap" in r]
    stale = sum(r.get("rollout/sync_stale", 0) for r in rows)
    print(
        f"{engine:<7} {evals[0]:.1%} -> {evals[-1]:.1%}{'':<5} {sum(r['time/step_s'] for r in steps) / len(steps):>7.2f} "
        f"{rollout_s / len(steps):>9.2f} {sampled / rollout_s:>9.0f} {max(gaps, default=float('nan')):>14.2e} {stale:>5.0f}"
    )
EOF
echo "== gpu_check: $([ $status = 0 ] && echo passed || echo FAILED) in $((SECONDS - started)) s"
exit $status
