# Tiny GLM-4.5 MoE for tests and CPU runs (2 layers, hidden 64, QKV bias, QK norm, partial rotary, 8 experts
# top-2 + 1 shared, vocab 128), Megatron model flags matching the config.json written by
# `python tools/make_tiny_model.py --variant glm4_moe`.
# Usage: source scripts/models/glm4.5-tiny.sh; then pass "${MODEL_ARGS[@]}" to train.py or the converters.
MODEL_ARGS=(
   --disable-bias-linear
   --add-qkv-bias
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
   # partial rotary: half of each head is rotated
   --rotary-percent 0.5
   --swiglu
   --untie-embeddings-and-output-weights
   --vocab-size 128
   --max-position-embeddings 512

   --rotary-base 1000000

   # moe: the first 1 layer(s) dense, sigmoid router with expert bias
   --num-experts 8
   --moe-ffn-hidden-size 32
   --moe-shared-expert-intermediate-size 32
   --moe-router-topk 2
   --moe-layer-freq "[0]*1+[1]*1"
   --moe-router-score-function sigmoid
   --moe-router-enable-expert-bias
   # the released bias is kept as is during RL (trainer and engine route alike)
   --moe-router-bias-update-rate 0
   --moe-router-topk-scaling-factor 2.5
   --moe-router-load-balancing-type seq_aux_loss
   --moe-aux-loss-coeff 0
   --moe-router-dtype fp32
   # allgather: the alltoall dispatcher creates a CUDA stream and cannot run on CPU
   --moe-token-dispatcher-type allgather

   # megatron-core's own layers: Transformer Engine is GPU-only
   --transformer-impl local
)
