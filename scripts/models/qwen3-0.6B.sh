# Qwen3-0.6B (dense, 28 layers, ~0.6B params; input embedding and output layer tied), Megatron model flags.
# Values from Qwen/Qwen3-0.6B config.json: hidden 1024, intermediate 3072, 16 heads, 8 kv heads,
# head_dim 128 (so attention width 2048 > hidden), vocab 151936, rope_theta 1e6, rms_norm_eps 1e-6,
# tie_word_embeddings true (so no --untie-embeddings-and-output-weights here).
# Usage: source scripts/models/qwen3-0.6B.sh; then pass "${MODEL_ARGS[@]}" to train.py or the converters.
MODEL_ARGS=(
   --disable-bias-linear
   --qk-layernorm
   --group-query-attention
   --num-attention-heads 16
   --num-query-groups 8
   --kv-channels 128
   --num-layers 28
   --hidden-size 1024
   --ffn-hidden-size 3072

   --normalization RMSNorm
   --position-embedding-type rope
   --norm-epsilon 1e-6
   --rotary-percent 1.0
   --swiglu
   --vocab-size 151936

   --rotary-base 1000000
)
