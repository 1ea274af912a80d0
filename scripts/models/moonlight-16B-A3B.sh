# Moonlight-16B-A3B (DeepseekV3ForCausalLM: 27 layers, MLA without q low-rank, 64 experts top-6 + 2 shared,
# ~16B params, ~3B active), Megatron model flags.
# Usage: source scripts/models/moonlight-16B-A3B.sh; then pass "${MODEL_ARGS[@]}" to train.py or the converters.
MODEL_ARGS=(
   --disable-bias-linear
   --num-layers 27
   --hidden-size 2048
   --ffn-hidden-size 11264
   --num-attention-heads 16

   --normalization RMSNorm
   --position-embedding-type rope
   --norm-epsilon 1e-5
   --rotary-percent 1.0
   --swiglu
   --untie-embeddings-and-output-weights
   --vocab-size 163840
   --rotary-base 50000

   # multi-latent attention (--qk-layernorm builds its q / kv latent norms)
   --multi-latent-attention
   --kv-lora-rank 512
   --qk-head-dim 128
   --qk-pos-emb-head-dim 64
   --v-head-dim 128
   --qk-layernorm
   --max-position-embeddings 8192

   # moe: the first 1 layer(s) dense, sigmoid router with expert bias
   --num-experts 64
   --moe-ffn-hidden-size 1408
   --moe-shared-expert-intermediate-size 2816
   --moe-router-topk 6
   --moe-layer-freq "[0]*1+[1]*26"
   --moe-router-score-function sigmoid
   --moe-router-enable-expert-bias
   # the released bias is kept as is during RL (trainer and engine route alike)
   --moe-router-bias-update-rate 0
   --moe-router-topk-scaling-factor 2.446
   --moe-router-load-balancing-type seq_aux_loss
   --moe-aux-loss-coeff 0
   --moe-token-dispatcher-type alltoall
   --moe-grouped-gemm
   --moe-token-drop-policy probs
   --moe-router-dtype fp32
   --moe-permute-fusion
)
