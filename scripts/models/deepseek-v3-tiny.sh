# Tiny DeepSeek-V3 for tests and CPU runs (2 layers, hidden 64, MLA, YaRN, 8 experts top-2 in 4 groups + 1
# shared, vocab 128), Megatron model flags matching the config.json written by
# `python tools/make_tiny_model.py --variant deepseek_v3`.
# Usage: source scripts/models/deepseek-v3-tiny.sh; then pass "${MODEL_ARGS[@]}" to train.py or the converters.
MODEL_ARGS=(
   --disable-bias-linear
   --num-layers 2
   --hidden-size 64
   --ffn-hidden-size 128
   --num-attention-heads 4

   --normalization RMSNorm
   --position-embedding-type rope
   --norm-epsilon 1e-6
   --rotary-percent 1.0
   --swiglu
   --untie-embeddings-and-output-weights
   --vocab-size 128
   --rotary-base 10000

   # multi-latent attention (--qk-layernorm builds its q / kv latent norms)
   --multi-latent-attention
   --q-lora-rank 32
   --kv-lora-rank 32
   --qk-head-dim 16
   --qk-pos-emb-head-dim 8
   --v-head-dim 16
   --qk-layernorm
   --max-position-embeddings 512

   # YaRN rotary scaling (HF rope_scaling)
   --rope-type yarn
   --rotary-scaling-factor 4
   --mscale 1.0
   --mscale-all-dim 1.0
   --original-max-position-embeddings 128
   --beta-fast 32
   --beta-slow 1

   # moe: the first 1 layer(s) dense, sigmoid router with expert bias,
   # group-limited: 1 of 4 expert groups per token
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
   --moe-router-num-groups 4
   --moe-router-group-topk 1
   --moe-router-load-balancing-type seq_aux_loss
   --moe-aux-loss-coeff 0
   --moe-router-dtype fp32
   # allgather: the alltoall dispatcher creates a CUDA stream and cannot run on CPU
   --moe-token-dispatcher-type allgather

   # megatron-core's own layers: Transformer Engine is GPU-only
   --transformer-impl local
)
