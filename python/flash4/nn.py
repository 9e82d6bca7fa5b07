"""torch.nn layers on flash4 (imports torch).

    from flash4.nn import Attention
    attn = Attention(dim=512, heads=8, causal=True)      # x (batch, seqlen, dim) -> (batch, seqlen, dim)
"""

from torch import nn

from ._api import flash_attn_func


class Attention(nn.Module):
    """Multi-head self-attention: one fused q/k/v projection, flash4 attention, an output projection.

    dim: model width; heads: query heads; heads_kv: key/value heads (default `heads`; fewer gives GQA/MQA, it
    must divide `heads`); head_dim defaults to dim // heads. causal, window_size, softcap and softmax_scale are
    flash_attn_func's. q, k and v are strided views of the projection's output (no copies).
    """

    def __init__(
        self,
        dim,
        heads,
        heads_kv=None,
        head_dim=None,
        causal=False,
        window_size=(-1, -1),
        softcap=0.0,
        softmax_scale=None,
        bias=False,
        deterministic=False,
        device=None,
        dtype=None,
    ):
        super().__init__()
        heads_kv = heads if heads_kv is None else heads_kv
        for name, count in (("heads", heads), ("heads_kv", heads_kv)):
            if count < 1:
                raise ValueError(f"{name} = {count} must be >= 1")
        if head_dim is None:
            if dim % heads != 0:
                raise ValueError(f"dim = {dim} is not a multiple of heads = {heads}; pass head_dim")
            head_dim = dim // heads
        if heads % heads_kv != 0:
            raise ValueError(f"heads = {heads} is not a multiple of heads_kv = {heads_kv}")
        self.heads, self.heads_kv, self.head_dim = heads, heads_kv, head_dim
        self.causal, self.window_size, self.softcap = causal, tuple(window_size), softcap
        self.softmax_scale, self.deterministic = softmax_scale, deterministic
        factory = {"device": device, "dtype": dtype}
        self.qkv = nn.Linear(dim, (heads + 2 * heads_kv) * head_dim, bias=bias, **factory)
        self.out = nn.Linear(heads * head_dim, dim, bias=bias, **factory)

    def forward(self, x):
        batch, seqlen, _ = x.shape
        qkv = self.qkv(x).view(batch, seqlen, self.heads + 2 * self.heads_kv, self.head_dim)
        q, k, v = qkv.split([self.heads, self.heads_kv, self.heads_kv], dim=2)
        y = flash_attn_func(
            q,
            k,
            v,
            softmax_scale=self.softmax_scale,
            causal=self.causal,
            window_size=self.window_size,
            softcap=self.softcap,
            deterministic=self.deterministic,
        )
        return self.out(y.reshape(batch, seqlen, self.heads * self.head_dim))

    def extra_repr(self):
        return (
            f"heads={self.heads}, heads_kv={self.heads_kv}, head_dim={self.head_dim}, causal={self.causal}, "
            f"window_size={self.window_size}, softcap={self.softcap}"
        )


__all__ = ["Attention"]
