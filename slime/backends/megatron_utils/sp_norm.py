"""RMSNorm that supports megatron sequence parallelism without Transformer Engine.

megatron-core's torch fallback norm (``WrappedTorchNorm``) refuses
``sequence_parallel``; with TP > 1 megatron requires sequence parallel for MoE, so
on CPU the local layer spec uses this module instead. With sequence parallel each
TP rank normalises its own sequence slice, so the weight's gradient is partial: the
parameter is marked ``sequence_parallel = True`` and megatron's
``finalize_model_grads`` all-reduces it across the TP group.
"""

import torch


class SequenceParallelRMSNorm(torch.nn.Module):
    """RMSNorm over the last dim, computed in float32 and cast back (as HF Qwen3 does); with
    ``config.layernorm_zero_centered_gamma`` (``--apply-layernorm-1p``) it scales by ``1 + weight``
    and the weight starts at zero (Qwen3-Next's norms).

    Signature matches megatron's norm modules: ``(config, hidden_size, eps)``; input
    ``[..., hidden_size]`` -> output of the same shape and dtype. The parameter is named
    ``weight`` (megatron checkpoint key ``*.layer_norm_weight`` after the spec's key map).
    """

    def __init__(self, config, hidden_size: int, eps: float = 1e-6, **_unused):
        super().__init__()
        if config.normalization != "RMSNorm":
            raise ValueError(
                f"SequenceParallelRMSNorm needs --normalization RMSNorm, got {config.normalization}"
            )
        self.eps = eps
        # --apply-layernorm-1p (layernorm_zero_centered_gamma): the weight is an offset from 1.
        self.zero_centered = bool(getattr(config, "layernorm_zero_centered_gamma", False))
        init = torch.zeros if self.zero_centered else torch.ones
        self.weight = torch.nn.Parameter(init(hidden_size, dtype=config.params_dtype))
        setattr(self.weight, "sequence_parallel", bool(config.sequence_parallel))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Normalise ``hidden`` by its root mean square and scale by ``weight`` (``1 + weight``
        with zero-centred gamma)."""
        dtype = hidden.dtype
        x = hidden.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        scale = self.weight + 1 if self.zero_centered else self.weight
        return scale * x.to(dtype)
