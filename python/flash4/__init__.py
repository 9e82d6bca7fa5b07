"""flash4: FlashAttention-4 (Hopper GPUs and the CPU) for Python.

    import flash4
    out = flash4.flash_attn_func(q, k, v, causal=True)       # q (batch, seqlen_q, heads, head_dim)
    out = flash4.flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
                                                               # packed: q (total_q, heads, head_dim)
    out = flash4.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lengths)  # inference
    out = flash4.flash_attn_qkvpacked_func(qkv, causal=True)  # also kvpacked and varlen forms, as flash-attn

Works on torch tensors (CPU and CUDA; autograd and torch.compile through the custom ops flash4::fwd and
flash4::bwd) and, forward only, on other DLPack arrays such as numpy arrays. Where torch is installed it is
imported with flash4, so that flash4.nn and torch.ops.flash4.* exist from the start. See docs/python.md.
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
)
from ._kvcache import flash_attn_with_kvcache
from ._offsets import check_kvcache_indices
from ._sdpa import scaled_dot_product_attention
from ._native import library_version
from ._packed import (
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)

__version__ = "0.1.0"

__all__ = [
    "Support",
    "__version__",
    "backward",
    "can_implement",
    "check_kvcache_indices",
    "check_varlen_offsets",
    "cuda_available",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "forward",
    "library_version",
    "scaled_dot_product_attention",
]


def _load_torch_parts():
    """Imports flash4.nn and registers the custom ops torch.ops.flash4.fwd / bwd / fwd_fp8 wherever torch is
    installed; a torch that fails to import leaves flash4 usable on other arrays, with a warning saying why."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return
    try:
        from . import _torch_fp8, _torch_ops, nn  # noqa: F401
    except ImportError as error:  # pragma: no cover - a broken torch install
        import warnings

        warnings.warn(f"flash4: torch is installed but could not be imported ({error}); flash4.nn and the "
                      "torch custom ops are unavailable", stacklevel=2)


_load_torch_parts()
