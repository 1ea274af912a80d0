# DeepSeek-V3 / DeepSeek-R1 (61 layers, MLA, 256 experts top-8 in 8 groups + 1 shared, ~671B params,
# ~37B active; the multi-token-prediction layer is not built), Megatron model flags.
# Usage: source scripts/models/deepseek-v3.sh; then pass "${MODEL_ARGS[@]}" to train.py or the converters.
MODEL_ARGS=(
   --disable-bias-linear
   --num-layers 61
   --hidden-size 7168
   --ffn-hidden-size 18432
   --num-attention-heads 128

   --normalization RMSNorm
   --position-embedding-type rope
   --norm-epsilon 1e-6
   --rotary-percent 1.0
   --swiglu
   --untie-embeddings-and-output-weights
   --vocab-size 129280
   --rotary-base 10000

   # multi-latent attention (--qk-layernorm builds its q / kv latent norms)
   --multi-latent-attention
   --q-lora-rank 1536
   --kv-lora-rank 512
   --qk-head-dim 128
   --qk-pos-emb-head-dim 64
   --v-head-dim 128
   --qk-layernorm
   --max-position-embeddings 163840

   # YaRN rotary scaling (HF rope_scaling)
   --rope-type yarn
   --rotary-scaling-factor 40
   --mscale 1.0
   --mscale-all-dim 1.0
   --original-max-position-embeddings 4096
   --beta-fast 32
   --beta-slow 1

   # moe: the first 3 layer(s) dense, sigmoid router with expert bias,
   # group-limited: 4 of 8 expert groups per token
   --num-experts 256
   --moe-ffn-hidden-size 2048
   --moe-shared-expert-intermediate-size 2048
   --moe-router-topk 8
   --moe-layer-freq "[0]*3+[1]*58"
   --moe-router-score-function sigmoid
   --moe-router-enable-expert-bias
   # the released bias is kept as is during RL (trainer and engine route alike)
   --moe-router-bias-update-rate 0
   --moe-router-topk-scaling-factor 2.5
   --moe-router-num-groups 8
   --moe-router-group-topk 4
   --moe-router-load-balancing-type seq_aux_loss
   --moe-aux-loss-coeff 0
   --moe-token-dispatcher-type alltoall
   --moe-grouped-gemm
   --moe-token-drop-policy probs
   --moe-router-dtype fp32
   --moe-permute-fusion
)
