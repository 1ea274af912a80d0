# Qwen3-4B (dense, 36 layers, ~4.0B params; input embedding and output layer tied), Megatron model flags.
# Values from Qwen/Qwen3-4B config.json: hidden 2560, intermediate 9728, 32 heads, 8 kv heads,
# head_dim 128, vocab 151936, rope_theta 1e6, rms_norm_eps 1e-6, tie_word_embeddings true
# (so no --untie-embeddings-and-output-weights here).
# Usage: source scripts/models/qwen3-4B.sh; then pass "${MODEL_ARGS[@]}" to train.py or the converters.
MODEL_ARGS=(
   --disable-bias-linear
   --qk-layernorm
   --group-query-attention
   --num-attention-heads 32
   --num-query-groups 8
   --kv-channels 128
   --num-layers 36
   --hidden-size 2560
   --ffn-hidden-size 9728

   --normalization RMSNorm
   --position-embedding-type rope
   --norm-epsilon 1e-6
   --rotary-percent 1.0
   --swiglu
   --vocab-size 151936

   --rotary-base 1000000
)
