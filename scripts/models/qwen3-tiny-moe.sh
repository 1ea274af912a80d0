# Tiny Qwen3-MoE for tests and CPU runs (2 layers, hidden 64, 8 experts top-2, vocab 128), Megatron
# model flags matching the config.json written by `python tools/make_tiny_model.py --variant moe`.
# Usage: source scripts/models/qwen3-tiny-moe.sh; then pass "${MODEL_ARGS[@]}" to train.py or the converters.
MODEL_ARGS=(
   --disable-bias-linear
   --qk-layernorm
   --group-query-attention
   --num-attention-heads 4
   --num-query-groups 2
   --kv-channels 16
   --num-layers 2
   --hidden-size 64
   --ffn-hidden-size 128

   --normalization RMSNorm
   --position-embedding-type rope
   --norm-epsilon 1e-6
   --rotary-percent 1.0
   --swiglu
   --untie-embeddings-and-output-weights
   --vocab-size 128

   --rotary-base 1000000

   # moe
   --moe-ffn-hidden-size 32
   --moe-router-score-function softmax
   # allgather: the alltoall dispatcher creates a CUDA stream and cannot run on CPU
   --moe-token-dispatcher-type allgather
   --moe-router-topk 2
   --moe-layer-freq "[1]*2"
   --num-experts 8
   --moe-router-dtype fp32
   --moe-aux-loss-coeff 0

   # megatron-core's own layers: Transformer Engine is GPU-only
   --transformer-impl local
)
