"""flash4 as an attention implementation of Hugging Face transformers.

    import flash4.integrations.transformers as f4hf
    name = f4hf.register()                              # once; "f4"
    model = AutoModelForCausalLM.from_config(config, attn_implementation=name)

What the model hands the attention function decides the path, as in transformers' own flash-attention
integration: precomputed cu_seq_lens_q/k (e.g. DataCollatorWithFlattening) or position_ids that restart inside
a row (padding-free packing; a document starts wherever a position is not the one before plus one, as in
transformers' masks, in every row of the batch) go through flash_attn_varlen_func, so packed documents never attend
to each other; a 2-D padding mask is unpadded into a packed batch (also under a KV cache: batched generation); otherwise
flash_attn_func runs on the dense batch.
Masks are bottom-right aligned (as in flash-attn), which is what a decoder with a KV cache needs. Attention sinks
(gpt-oss's `s_aux`) become flash4's learnable_sink, with their gradient.
"""

import weakref

import torch

import flash4

# Not "flash4": transformers treats any implementation name containing "flash" as a flash-attn kernel to load.
NAME = "f4"


def _window(sliding_window, is_causal):
    # transformers' sliding_window counts the query's own position (as its flash-attention integration does).
    if not sliding_window:
        return (-1, -1)
    return (sliding_window - 1, 0 if is_causal else sliding_window - 1)


def _offsets_from_position_ids(position_ids):
    """cu_seqlens (int32) and the longest length of the documents of position_ids (batch, seqlen), flattened; None
    for one document a row. A document starts at each row's start and wherever a position is not the one before
    plus one, as transformers' masks read packed position ids (find_packed_sequence_indices)."""
    starts = torch.ones(position_ids.shape, dtype=torch.bool, device=position_ids.device)
    starts[:, 1:] = position_ids.diff(dim=-1) != 1
    starts = starts.reshape(-1).nonzero().reshape(-1).to(torch.int32)
    if starts.numel() == position_ids.shape[0]:
        return None
    cu = torch.cat([starts, torch.tensor([position_ids.numel()], dtype=torch.int32, device=position_ids.device)])
    return cu, int(cu.diff().max())


class _PackingOfPositions:
    """Whether position_ids describe a packed batch, and its offsets, computed once per position_ids tensor: the
    model hands every layer the same tensor, and each answer costs a device synchronization. The cache holds one
    entry, keyed by the tensor's identity (a weak reference, so a freed tensor's address is never mistaken for
    it), its version counter (an in-place change invalidates it) and the batch size."""

    def __init__(self):
        self._ref, self._version, self._batch, self._answer = None, None, None, None

    def __call__(self, position_ids, batch):
        """(cu_seqlens, longest) for a packed batch, None otherwise. Only (batch, seqlen) or (1, seqlen) position ids
        describe packing: multimodal rotary embeddings (Qwen2-VL's mrope: (3, batch, seqlen)) repeat positions by
        design."""
        if position_ids is None or position_ids.dim() != 2 or position_ids.shape[0] not in (1, batch) \
                or position_ids.shape[-1] <= 1:
            return None
        if self._ref is None or self._ref() is not position_ids or self._version != position_ids._version \
                or self._batch != batch:
            answer = _offsets_from_position_ids(position_ids.expand(batch, -1))
            self._ref, self._version, self._batch = weakref.ref(position_ids), position_ids._version, batch
            self._answer = answer
        return self._answer


_packing_of = _PackingOfPositions()


# Attention-function arguments of some models that change what attention computes and that flash4 has no form for.
_UNSUPPORTED = {"position_bias": "an additive attention bias such as T5's relative positions",
                "sinks": "per-token attention sinks", "indices": "a sparse attention's selected keys",
                "block_indices": "a sparse attention's selected key blocks"}


def flash4_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                             sliding_window=None, softcap=None, is_causal=None, s_aux=None, position_ids=None,
                             cu_seq_lens_q=None, cu_seq_lens_k=None, max_length_q=None, max_length_k=None,
                             **kwargs):
    """transformers' attention-function signature: query (batch, heads, seqlen_q, head_dim), key/value
    (batch, heads_kv, seqlen_k, head_dim); returns (out (batch, seqlen_q, heads, head_dim), None)."""
    if dropout:
        raise NotImplementedError("flash4 has no attention dropout; set the model's attention_dropout to 0")
    for name, what in _UNSUPPORTED.items():
        if kwargs.get(name) is not None:
            raise NotImplementedError(f"flash4 does not take {what} (`{name}`); use attn_implementation='sdpa' or "
                                      "'eager' for this model")
    if kwargs.get("output_attentions", False):
        raise NotImplementedError("flash4 does not materialize attention probabilities; use attn_implementation='eager'")
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    options = dict(softmax_scale=scaling, causal=bool(is_causal), window_size=_window(sliding_window, is_causal),
                   softcap=float(softcap or 0.0), learnable_sink=s_aux,
                   deterministic=bool(kwargs.get("deterministic", False)))
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # (batch, seqlen, heads, head_dim)
    batch, seqlen_q, heads, dim = q.shape
    seqlen_k = k.shape[1]

    if cu_seq_lens_q is not None and cu_seq_lens_k is not None and max_length_q is not None:
        out = flash4.flash_attn_varlen_func(q.reshape(-1, heads, dim), k.reshape(-1, *k.shape[2:]),
                                            v.reshape(-1, *v.shape[2:]), cu_seq_lens_q, cu_seq_lens_k,
                                            int(max_length_q), int(max_length_k), **options)
        return out.view(batch, seqlen_q, heads, out.shape[-1]), None  # v's head dim (MLA: narrower than q's)
    packing = _packing_of(position_ids, batch) if attention_mask is None and seqlen_q == seqlen_k else None
    if packing is not None:
        cu, longest = packing
        out = flash4.flash_attn_varlen_func(q.reshape(-1, heads, dim), k.reshape(-1, *k.shape[2:]),
                                            v.reshape(-1, *v.shape[2:]), cu, cu, longest, longest, **options)
        return out.view(batch, seqlen_q, heads, out.shape[-1]), None
    if attention_mask is not None and attention_mask.dim() == 2:
        return _unpadded(q, k, v, attention_mask, options), None
    if attention_mask is not None:
        raise NotImplementedError(f"flash4 takes a 2-D padding mask or none, got shape {tuple(attention_mask.shape)}; "
                                  "register() installs the matching mask function")
    return flash4.flash_attn_func(q, k, v, **options), None


class _Unpadding:
    """What a padding mask says for one layer shape: None where every token is real, else the packed batch's
    (cu_seqlens_q, cu_seqlens_k, query rows, key rows, longest_q, longest_k). Finding it costs device
    synchronizations, and the model hands every layer the same mask tensor, so the answer is kept for one key:
    the tensor's identity (a weak reference, so a freed tensor's address is never mistaken for it), its version
    counter (an in-place change invalidates it) and the layer's (seqlen_q, seqlen_k, own queries). Not kept while
    torch.compile traces (the answer would be a traced value)."""

    def __init__(self):
        self._ref, self._key, self._answer = None, None, None

    def __call__(self, mask, seqlen_q, seqlen_k, own):
        key = (mask._version, seqlen_q, seqlen_k, own)
        if torch.compiler.is_compiling():
            return _unpadding(mask, seqlen_q, seqlen_k, own)
        if self._ref is None or self._ref() is not mask or self._key != key:
            answer = _unpadding(mask, seqlen_q, seqlen_k, own)
            self._ref, self._key, self._answer = weakref.ref(mask), key, answer
        return self._answer


def _unpadding(mask, seqlen_q, seqlen_k, own):
    """_Unpadding's answer for mask (batch, length), computed."""
    batch = mask.shape[0]
    mask = mask.bool()
    mask_k = mask[:, -seqlen_k:] if mask.shape[1] >= seqlen_k else \
        torch.nn.functional.pad(mask, (0, seqlen_k - mask.shape[1]))
    mask_q = mask[:, -seqlen_q:] if own else torch.ones(batch, seqlen_q, dtype=torch.bool, device=mask.device)
    lengths_k, lengths_q = mask_k.sum(-1, dtype=torch.int32), mask_q.sum(-1, dtype=torch.int32)
    # One synchronization for what the host must know: whether there is padding at all, and the longest rows.
    no_padding, longest_k, longest_q = torch.stack([mask.all(), lengths_k.max(), lengths_q.max()]).tolist()
    if no_padding:
        return None
    cu_k = torch.nn.functional.pad(lengths_k.cumsum(0, dtype=torch.int32), (1, 0))
    cu_q = torch.nn.functional.pad(lengths_q.cumsum(0, dtype=torch.int32), (1, 0))
    index_k, index_q = mask_k.reshape(-1).nonzero().reshape(-1), mask_q.reshape(-1).nonzero().reshape(-1)
    return cu_q, cu_k, index_q, index_k, max(longest_q, 1), max(longest_k, 1)


_unpadding_of = _Unpadding()


def _unpadded(q, k, v, mask, options):
    """A padded batch (mask (batch, length), 1 = token) run as a packed batch. The keys are the mask's last
    seqlen_k columns; a static cache's slots past the mask hold no token yet and take no part. Without a causal
    mask or a sliding window the mask hides keys only, as in eager attention (cross-attention: the mask is the
    encoder's), and every query row runs. With either, the queries are the last seqlen_q positions the mask
    covers, their own mask its last seqlen_q columns, as in transformers' flash-attention integration (with a KV
    cache there are fewer queries than keys; left padding keeps every row's tokens last, where the bottom-right
    causal mask aligns them); the padding rows' outputs are zeros. A window without a causal mask (ModernBERT's
    local layers) thus counts from each token's own position, with right padding as with left."""
    batch, seqlen_q, heads, _ = q.shape
    seqlen_k = k.shape[1]
    causal = options["causal"]
    own = causal or options["window_size"] != (-1, -1)  # queries of the keys' own sequence
    if own and seqlen_q > min(seqlen_k, mask.shape[1]):
        raise NotImplementedError(f"flash4's transformers integration takes a padding mask that covers the queries, "
                                  f"got {seqlen_q} queries, {seqlen_k} keys and a mask of {mask.shape[1]} positions")
    if batch == 0:
        return q.new_zeros(0, seqlen_q, heads, v.shape[-1])
    unpadding = _unpadding_of(mask, seqlen_q, seqlen_k, own)
    if unpadding is None:
        # Every token real (a static cache's mask without padding): the dense kernels on views of the keys the
        # cache holds, with no copies (and, for a few queries, the GPU's split-KV decode kernel).
        present = min(mask.shape[1], seqlen_k)
        return flash4.flash_attn_func(q, k[:, :present], v[:, :present], **options)
    cu_q, cu_k, index_q, index_k, longest_q, longest_k = unpadding
    pack = lambda t, index: t.reshape(-1, *t.shape[2:]).index_select(0, index)  # noqa: E731
    out = flash4.flash_attn_varlen_func(pack(q, index_q), pack(k, index_k), pack(v, index_k), cu_q, cu_k,
                                        longest_q, longest_k, **options)
    dim_v = out.shape[-1]  # v's head dim (MLA: narrower than q's)
    padded = out.new_zeros(batch * seqlen_q, heads, dim_v)
    return padded.index_copy(0, index_q, out).view(batch, seqlen_q, heads, dim_v)


def flash4_attention_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, attention_mask=None, **kwargs):
    """transformers' flash-attention mask (None, or the 2-D padding mask over the tokens seen); and where a static
    cache holds more slots than tokens and no padding mask came (generate keeps an all-ones mask only for
    implementations whose name says flash), ones over the tokens, so that the attention leaves the empty slots
    out. A cache position on the device costs one synchronization per forward there."""
    from transformers.masking_utils import flash_attention_mask

    if getattr(kwargs.get("config"), "alibi", False):  # Falcon adds its alibi bias onto the mask made here
        raise NotImplementedError("flash4 does not take an alibi position bias (config.alibi); use "
                                  "attn_implementation='sdpa' or 'eager' for this model")
    mask = flash_attention_mask(batch_size, q_length, kv_length, q_offset=q_offset, kv_offset=kv_offset,
                                attention_mask=attention_mask, **kwargs)
    if mask is None:
        present = int(q_offset) + q_length - int(kv_offset)  # keys the layer's cache holds
        if present < kv_length:
            mask = torch.ones(batch_size, present, dtype=torch.bool, device=kwargs.get("device"))
    return mask


def register(name=NAME):
    """Registers flash4 under `name` with transformers' attention and attention-mask interfaces; returns the name
    for attn_implementation=."""
    from transformers import AttentionInterface, AttentionMaskInterface

    AttentionInterface.register(name, flash4_attention_forward)
    AttentionMaskInterface.register(name, flash4_attention_mask)
    return name
