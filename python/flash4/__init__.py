"""flash4: FlashAttention-4 (Hopper GPUs and the CPU) for Python.

    import flash4
    out = flash4.flash_attn_func(q, k, v, causal=True)       # q (batch, seqlen_q, heads, head_dim)
    out = flash4.flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
                                                               # packed: q (total_q, heads, head_dim)
    out = flash4.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lengths)  # inference

Works on torch tensors (CPU and CUDA; autograd and torch.compile through the custom ops flash4::fwd and
flash4::bwd) and, forward only, on other DLPack arrays such as numpy arrays. torch is imported only when
torch tensors are passed. See docs/python.md.
"""

from ._api import (
    Support,
    backward,
    can_implement,
    check_varlen_offsets,
    cuda_available,
    flash_attn_func,
    flash_attn_varlen_func,
    forward,
    scaled_dot_product_attention,
)
from ._kvcache import flash_attn_with_kvcache
from ._native import library_version

__version__ = "0.1.0"

__all__ = [
    "Support",
    "__version__",
    "backward",
    "can_implement",
    "check_varlen_offsets",
    "cuda_available",
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attn_with_kvcache",
    "forward",
    "library_version",
    "scaled_dot_product_attention",
]
