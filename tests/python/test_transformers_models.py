"""flash4 inside Hugging Face transformers, architecture by architecture: tiny randomly initialised models (built
from configs, nothing downloaded) with attn_implementation="f4" against the same weights with eager attention, on
the paths where an architecture hands the attention function something of its own (CPU, fp32)."""

import copy

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", reason="transformers is not installed: pip install transformers")

import flash4.integrations.transformers as f4hf  # noqa: E402


def pair(model_class, config):
    """The same random weights with eager attention and with flash4, each model with a config of its own."""
    torch.manual_seed(0)
    eager = model_class(copy.deepcopy(config)).float().eval()
    eager.set_attn_implementation("eager")
    ours = model_class(copy.deepcopy(config)).float().eval()
    ours.set_attn_implementation(f4hf.register())
    ours.load_state_dict(eager.state_dict())
    return eager, ours


def tiny_llama():
    return pair(transformers.LlamaForCausalLM,
                transformers.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                         max_position_embeddings=128))


@pytest.mark.parametrize("position_ids, batch", [
    ([list(range(5, 12)) + list(range(12))], 1),  # the first document continues one cut before it: positions 5 .. 11
    ([list(range(4)) + list(range(7, 12)) + list(range(10))], 1),  # a jump forward starts a document, as in eager
    ([list(range(8)) + list(range(11)), list(range(3)) + list(range(16))], 2),  # a batch of two packed rows
    ([list(range(8)) + list(range(11))], 2),  # one row of positions for a batch of two (a model's unsqueeze(0))
])
def test_packed_position_ids_match_eager(position_ids, batch):
    """Padding-free packing as transformers' masks read position_ids: a document starts at each row's start and
    wherever a position is not the one before plus one, in every row of the batch."""
    eager, ours = tiny_llama()
    position_ids = torch.tensor(position_ids)
    ids = torch.randint(0, 97, (batch, position_ids.shape[1]))
    with torch.no_grad():
        theirs = eager(ids, position_ids=position_ids, use_cache=False).logits
        torch.testing.assert_close(ours(ids, position_ids=position_ids, use_cache=False).logits, theirs,
                                   rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("padding", ["right", "left"])
def test_bidirectional_sliding_window_with_padding_matches_eager(padding):
    """ModernBERT's local layers (a window on both sides, no causal mask) over a padded batch: the window is
    counted from each token's own position, with right padding as with left; hidden states and gradients."""
    config = transformers.ModernBertConfig(vocab_size=97, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                                           intermediate_size=128, local_attention=8, global_attn_every_n_layers=3,
                                           pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1,
                                           sep_token_id=2)
    eager, ours = pair(transformers.ModernBertModel, config)
    ids = torch.randint(3, 97, (2, 19))
    mask = torch.ones_like(ids)
    if padding == "right":
        mask[1, 12:] = 0
    else:
        mask[1, :7] = 0
    keep = mask.bool()
    results = []
    for model in (eager, ours):
        hidden = model(ids, attention_mask=mask).last_hidden_state
        (hidden[keep] ** 2).sum().backward()
        results.append((hidden[keep].detach(), [p.grad for p in model.parameters()]))
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-4, atol=1e-4)
    for a, b in zip(results[1][1], results[0][1]):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)


def test_falcon_alibi_is_refused_by_name():
    """ALiBi Falcon adds its position bias to the mask, which flash4 has no form for: transformers refuses it for
    implementations named flash...; flash4 refuses it by name instead of an AttributeError (no padding) or a
    4-D-mask error (padding)."""
    config = transformers.FalconConfig(vocab_size=97, hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                                       alibi=True)
    _, ours = pair(transformers.FalconForCausalLM, config)
    if ours.config._attn_implementation != f4hf.NAME:
        pytest.skip(f"transformers {transformers.__version__}'s Falcon does not take a registered attention function")
    ids = torch.randint(0, 97, (2, 9))
    for mask in (None, torch.ones_like(ids).index_fill_(1, torch.tensor([0]), 0)):
        with pytest.raises(NotImplementedError, match="alibi"):
            ours(ids, attention_mask=mask)
