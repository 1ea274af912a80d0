# Kimi-K2 (DeepseekV3ForCausalLM: 61 layers, MLA with 64 heads, 384 experts top-8 + 1 shared, ~1.04T params,
# ~32B active), Megatron model flags.
# Usage: source scripts/models/kimi-k2.sh; then pass "${MODEL_ARGS[@]}" to train.py or the converters.
MODEL_ARGS=(
   --disable-bias-linear
   --num-layers 61
   --hidden-size 7168
   --ffn-hidden-size 18432
   --num-attention-heads 64

   --normalization RMSNorm
   --position-embedding-type rope
   --norm-epsilon 1e-6
   --rotary-percent 1.0
   --swiglu
   --untie-embeddings-and-output-weights
   --vocab-size 163840
   --rotary-base 50000

   # multi-latent attention (--qk-layernorm builds its q / kv latent norms)
   --multi-latent-attention
   --q-lora-rank 1536
   --kv-lora-rank 512
   --qk-head-dim 128
   --qk-pos-emb-head-dim 64
   --v-head-dim 128
   --qk-layernorm
   --max-position-embeddings 131072

   # YaRN rotary scaling (HF rope_scaling)
   --rope-type yarn
   --rotary-scaling-factor 32
   --mscale 1.0
   --mscale-all-dim 1.0
   --original-max-position-embeddings 4096
   --beta-fast 1
   --beta-slow 1

   # moe: the first 1 layer(s) dense, sigmoid router with expert bias
   --num-experts 384
   --moe-ffn-hidden-size 2048
   --moe-shared-expert-intermediate-size 2048
   --moe-router-topk 8
   --moe-layer-freq "[0]*1+[1]*60"
   --moe-router-score-function sigmoid
   --moe-router-enable-expert-bias
   # the released bias is kept as is during RL (trainer and engine route alike)
   --moe-router-bias-update-rate 0
   --moe-router-topk-scaling-factor 2.827
   --moe-router-load-balancing-type seq_aux_loss
   --moe-aux-loss-coeff 0
   --moe-token-dispatcher-type alltoall
   --moe-grouped-gemm
   --moe-token-drop-policy probs
   --moe-router-dtype fp32
   --moe-permute-fusion
)
