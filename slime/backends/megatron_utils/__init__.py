"""megatron-core training backend: model from args, HF<->Megatron weight maps, train step, checkpoints."""
