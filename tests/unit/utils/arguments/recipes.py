"""Reference flag sets shared by the argument tests (Qwen3-30B-A3B, as slime's scripts pass it)."""

import json
from pathlib import Path

QWEN3_30B_A3B_MODEL_ARGS = (
    "--disable-bias-linear --qk-layernorm --group-query-attention --num-attention-heads 32 "
    "--num-query-groups 4 --kv-channels 128 --num-layers 48 --hidden-size 2048 --ffn-hidden-size 6144 "
    "--normalization RMSNorm --position-embedding-type rope --norm-epsilon 1e-6 --rotary-percent 1.0 "
    "--swiglu --untie-embeddings-and-output-weights --vocab-size 151936 --rotary-base 1000000 "
    "--moe-ffn-hidden-size 768 --moe-router-score-function softmax --moe-token-dispatcher-type alltoall "
    "--moe-router-topk 8 --moe-layer-freq [1]*48 --num-experts 128 --moe-grouped-gemm "
    "--moe-token-drop-policy probs --moe-router-dtype fp32 --moe-permute-fusion --moe-aux-loss-coeff 0"
).split()

QWEN3_30B_A3B_RUN_ARGS = (
    "--tensor-model-parallel-size 4 --sequence-parallel --pipeline-model-parallel-size 1 "
    "--context-parallel-size 1 --expert-model-parallel-size 8 --expert-tensor-parallel-size 1 "
    "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1 "
    "--use-dynamic-batch-size --max-tokens-per-gpu 8192 --optimizer-cpu-offload "
    "--overlap-cpu-optimizer-d2h-h2d --use-precision-aware-optimizer --advantage-estimator grpo "
    "--use-kl-loss --kl-loss-coef 0.00 --kl-loss-type low_var_kl --entropy-coef 0.00 --eps-clip 0.2 "
    "--eps-clip-high 0.28 --optimizer adam --lr 1e-6 --lr-decay-style constant --weight-decay 0.1 "
    "--adam-beta1 0.9 --adam-beta2 0.98 --rollout-batch-size 32 --n-samples-per-prompt 8 "
    "--global-batch-size 256 --rollout-max-response-len 8192 --rollout-temperature 1 --num-rollout 3000 "
    "--rollout-shuffle --rm-type deepscaler --balance-data --rollout-num-gpus-per-engine 8 "
    "--sglang-mem-fraction-static 0.7 --sglang-ep-size 8 --sglang-enable-dp-attention --sglang-dp-size 8 "
    "--attention-dropout 0.0 --hidden-dropout 0.0 --accumulate-allreduce-grads-in-fp32 "
    "--attention-softmax-in-fp32 --attention-backend flash --actor-num-nodes 1 --actor-num-gpus-per-node 8 "
    "--colocate --hf-checkpoint /root/Qwen3-30B-A3B --ref-load /root/Qwen3-30B-A3B_torch_dist "
    "--load /root/Qwen3-30B-A3B_slime/ --save /root/Qwen3-30B-A3B_slime/ --save-interval 20 "
    "--prompt-data /root/dapo-math-17k/dapo-math-17k.jsonl --input-key prompt --label-key label "
    "--apply-chat-template --eval-interval 5 --eval-prompt-data aime /root/aime-2024/aime-2024.jsonl "
    "--n-samples-per-eval-prompt 16 --eval-max-response-len 16384 --eval-top-p 0.7 --use-wandb "
    "--wandb-project slime-dev --wandb-group qwen3-30B-A3B-test --wandb-key SECRET --dry-run"
).split()

QWEN3_30B_A3B_ARGS = QWEN3_30B_A3B_MODEL_ARGS + QWEN3_30B_A3B_RUN_ARGS

# Qwen3-30B-A3B's released config.json (tests/data/hf-configs, see SOURCES.md there).
QWEN3_30B_A3B_HF_CONFIG = json.loads(
    (Path(__file__).resolve().parents[3] / "data" / "hf-configs" / "Qwen3-30B-A3B" / "config.json").read_text())
