# GLM-4.5-Air (46 layers, GQA 96/8 heads with QKV bias, no QK norm, partial rotary, 128 experts top-8 + 1
# shared, ~106B params, ~12B active; the multi-token-prediction layer is not built), Megatron model flags.
# Usage: source scripts/models/glm4.5-106B-A12B.sh; then pass "${MODEL_ARGS[@]}" to train.py or the converters.
MODEL_ARGS=(
   --disable-bias-linear
   --add-qkv-bias
   --group-query-attention
   --num-attention-heads 96
   --num-query-groups 8
   --kv-channels 128
   --num-layers 46
   --hidden-size 4096
   --ffn-hidden-size 10944

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

   # moe: the first 1 layer(s) dense, sigmoid router with expert bias
   --num-experts 128
   --moe-ffn-hidden-size 1408
   --moe-shared-expert-intermediate-size 1408
   --moe-router-topk 8
   --moe-layer-freq "[0]*1+[1]*45"
   --moe-router-score-function sigmoid
   --moe-router-enable-expert-bias
   # the released bias is kept as is during RL (trainer and engine route alike)
   --moe-router-bias-update-rate 0
   # GLM-4.5-Air's released routed_scaling_factor is 1.0 (GLM-4.5's is 2.5)
   --moe-router-topk-scaling-factor 1.0
   --moe-router-load-balancing-type seq_aux_loss
   --moe-aux-loss-coeff 0
   --moe-token-dispatcher-type alltoall
   --moe-grouped-gemm
   --moe-token-drop-policy probs
   --moe-router-dtype fp32
   --moe-permute-fusion
)
