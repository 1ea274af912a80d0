# GLM-4.5 (92 layers, GQA 96/8 heads with QKV bias and QK norm, partial rotary, 160 experts top-8 + 1 shared,
# ~355B params, ~32B active; the multi-token-prediction layer is not built), Megatron model flags. Also GLM-4.6 / 4.7.
# Usage: source scripts/models/glm4.5-355B-A32B.sh; then pass "${MODEL_ARGS[@]}" to train.py or the converters.
MODEL_ARGS=(
   --disable-bias-linear
   --add-qkv-bias
   --qk-layernorm
   --group-query-attention
   --num-attention-heads 96
   --num-query-groups 8
   --kv-channels 128
   --num-layers 92
   --hidden-size 5120
   --ffn-hidden-size 12288

   --normalization RMSNorm
   --position-embedding-type rope
   --norm-epsilon 1e-5
   # partial rotary: half of each head is rotated
   --rotary-percent 0.5
   --swiglu
   --untie-embeddings-and-output-weights
   --vocab-size 151552
   --max-position-embeddings 131072

   --rotary-base 1000000

   # moe: the first 3 layer(s) dense, sigmoid router with expert bias
   --num-experts 160
   --moe-ffn-hidden-size 1536
   --moe-shared-expert-intermediate-size 1536
   --moe-router-topk 8
   --moe-layer-freq "[0]*3+[1]*89"
   --moe-router-score-function sigmoid
   --moe-router-enable-expert-bias
   # the released bias is kept as is during RL (trainer and engine route alike)
   --moe-router-bias-update-rate 0
   --moe-router-topk-scaling-factor 2.5
   --moe-router-load-balancing-type seq_aux_loss
   --moe-aux-loss-coeff 0
   --moe-token-dispatcher-type alltoall
   --moe-grouped-gemm
   --moe-token-drop-policy probs
   --moe-router-dtype fp32
   --moe-permute-fusion
)
