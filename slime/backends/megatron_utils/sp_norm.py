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
    """RMSNorm over the last dim, computed in float32 and cast back (as HF Qwen3 does).

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
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=config.params_dtype))
        setattr(self.weight, "sequence_parallel", bool(config.sequence_parallel))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Normalise ``hidden`` by its root mean square and scale by ``weight``."""
        dtype = hidden.dtype
        x = hidden.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)
