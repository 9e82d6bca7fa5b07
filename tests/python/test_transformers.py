"""flash4 inside Hugging Face transformers: a small randomly initialised Llama-architecture model (built from a
config, nothing downloaded) with attn_implementation="f4" (flash4) against the same weights with "sdpa" and "eager":
logits of a plain batch, of a padded batch, of a padding-free packed batch (position_ids, which must equal the
padded batch's logits per document), and the gradients of a training step. CPU in CI (fp32); on a Hopper GPU the
same in bf16 against the fp32 model, as close to it as bf16 SDPA."""

import copy
import inspect

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", reason="transformers is not installed: pip install transformers")

import flash4  # noqa: E402
import flash4.integrations.transformers as f4hf  # noqa: E402

# The fp32 model runs on the CPU only (the GPU kernels take bf16 / fp16): the GPU's tests are the bf16 ones below.
DEVICES = [pytest.param("cpu", id="cpu")]


def tiny_llama(attn_implementation, device, seed=0):
    config = transformers.LlamaConfig(vocab_size=97, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                      max_position_embeddings=256, attention_dropout=0.0)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config)
    model.set_attn_implementation(attn_implementation)
    return model.to(device=device, dtype=torch.float32)


def pair(device, other="sdpa"):
    ours = tiny_llama(f4hf.register(), device)
    theirs = tiny_llama(other, device)
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("other", ["sdpa", "eager"])
def test_logits_match(device, other):
    ours, theirs = pair(device, other)
    ids = torch.randint(0, 97, (2, 37), device=device)
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, theirs(ids).logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_padded_batch_matches_sdpa(device):
    ours, theirs = pair(device)
    ids = torch.randint(0, 97, (3, 20), device=device)
    mask = torch.ones(3, 20, dtype=torch.long, device=device)
    mask[1, 13:] = 0  # right padding
    mask[2, 5:] = 0
    with torch.no_grad():
        a = ours(ids, attention_mask=mask).logits
        b = theirs(ids, attention_mask=mask).logits
    keep = mask.bool()
    torch.testing.assert_close(a[keep], b[keep], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_left_padded_generation_with_a_kv_cache_matches_sdpa(device):
    """A left-padded prompt batch, then steps of 1 and of 3 new tokens against the KV cache (fewer queries than keys
    under a padding mask); every step's logits equal SDPA's on the real tokens."""
    ours, theirs = pair(device)
    ids = torch.randint(1, 97, (3, 12), device=device)
    mask = torch.ones(3, 12, dtype=torch.long, device=device)
    mask[1, :5] = 0  # left padding
    mask[2, :11] = 0  # one real token
    steps = [torch.randint(1, 97, (3, n), device=device) for n in (1, 3, 1)]
    # The cache argument's name (past_key_values, cache in newer transformers); the cache fills in place.
    cache_arg = "cache" if "cache" in inspect.signature(ours.forward).parameters else "past_key_values"
    logits = []
    for model in (ours, theirs):
        cache, m, out = transformers.DynamicCache(), mask, []
        with torch.no_grad():
            for chunk in [ids] + steps:
                if chunk is not ids:
                    m = torch.cat([m, torch.ones_like(chunk)], dim=1)
                out.append(model(chunk, attention_mask=m, use_cache=True, **{cache_arg: cache}).logits)
        logits.append(out)
    for step, (a, b) in enumerate(zip(*logits)):
        keep = mask.bool() if step == 0 else torch.ones(a.shape[:2], dtype=torch.bool, device=device)
        torch.testing.assert_close(a[keep], b[keep], rtol=1e-4, atol=1e-4, msg=f"step {step}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cache", [None, "static"])
@pytest.mark.parametrize("padded", [False, True])
def test_generate_matches_sdpa(device, cache, padded):
    """model.generate's scores at every step equal SDPA's: dynamic and static caches (whose empty slots past the
    tokens must take no part, also when generate drops an all-ones mask), left-padded or not."""
    ours, theirs = pair(device)
    ids = torch.randint(1, 97, (3, 12), device=device)
    mask = torch.ones_like(ids)
    if padded:
        mask[1, :5] = 0
        mask[2, :11] = 0
    runs = [model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0,
                           cache_implementation=cache, output_scores=True, return_dict_in_generate=True)
            for model in (ours, theirs)]
    assert torch.equal(runs[0].sequences, runs[1].sequences)
    for step, (a, b) in enumerate(zip(runs[0].scores, runs[1].scores)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, msg=f"step {step}")


def test_static_cache_without_padding_runs_the_dense_kernels(monkeypatch):
    """A static cache's mask without padding takes views of the keys the cache holds into flash_attn_func (no
    copies; on the GPU a few queries run the split-KV decode kernel), not the packed path."""
    ours, theirs = pair("cpu")
    ids = torch.randint(1, 97, (2, 12))
    expected = theirs.generate(input_ids=ids, max_new_tokens=4, do_sample=False, pad_token_id=0,
                               cache_implementation="static")

    def packed(*args, **kwargs):
        raise AssertionError("the packed path ran for a batch without padding")

    monkeypatch.setattr(flash4, "flash_attn_varlen_func", packed)
    tokens = ours.generate(input_ids=ids, max_new_tokens=4, do_sample=False, pad_token_id=0,
                           cache_implementation="static")
    assert torch.equal(tokens, expected)


@pytest.mark.parametrize("device", DEVICES)
def test_encoder_decoder_cross_attention_with_a_padded_encoder_matches_eager(device):
    """Bart: the cross-attention's 2-D mask is the encoder's and hides keys only (every decoder row attends);
    logits of a padded source batch at every decoder position, and greedy generation, equal eager attention's."""
    config = transformers.BartConfig(vocab_size=97, d_model=64, encoder_layers=1, decoder_layers=1,
                                     encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                     decoder_ffn_dim=64, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
                                     eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=None)
    torch.manual_seed(0)
    model = transformers.BartForConditionalGeneration(config).to(device=device, dtype=torch.float32).eval()
    src = torch.randint(3, 97, (2, 16), device=device)
    src_mask = torch.ones_like(src)
    src_mask[1, 11:] = 0
    tgt = torch.randint(3, 97, (2, 7), device=device)
    results = []
    for implementation in ("eager", f4hf.register()):
        model.set_attn_implementation(implementation)
        with torch.no_grad():
            logits = model(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt).logits
            tokens = model.generate(input_ids=src, attention_mask=src_mask, max_new_tokens=5, do_sample=False)
        results.append((logits, tokens))
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-4, atol=1e-4)
    assert torch.equal(results[1][1], results[0][1])


def test_multimodal_rotary_position_ids_are_not_taken_for_packing():
    """Qwen2-VL's mrope position ids (3, batch, seqlen) repeat positions inside an image: one sequence, not a
    packed batch of documents."""
    q, k, v = torch.randn(1, 4, 12, 16), torch.randn(1, 2, 12, 16), torch.randn(1, 2, 12, 16)
    position_ids = torch.arange(12)[None, None].repeat(3, 1, 1)
    position_ids[1:, :, 3:8] = 3

    class Causal:
        is_causal = True

    out, _ = f4hf.flash4_attention_forward(Causal(), q, k, v, None, position_ids=position_ids)
    dense = flash4.flash_attn_func(*(t.transpose(1, 2) for t in (q, k, v)), causal=True)
    torch.testing.assert_close(out, dense, rtol=0, atol=0)


def test_attention_biases_and_sparse_attention_are_refused_by_name():
    """Arguments that change what attention computes and flash4 has no form for (T5's relative position bias,
    per-token sinks, a sparse attention's key indices) raise instead of being dropped."""
    q = torch.randn(1, 2, 5, 16)
    for name in ("position_bias", "sinks", "indices", "block_indices"):
        with pytest.raises(NotImplementedError, match=name):
            f4hf.flash4_attention_forward(None, q, q, q, None, is_causal=True, **{name: torch.zeros(1)})


@pytest.mark.parametrize("device", DEVICES)
def test_packed_batch_equals_padded_batch(device):
    """Padding-free packing: documents concatenated into one row with restarting position_ids go through the
    varlen path and give each document the logits it gets on its own (no cross-document attention)."""
    ours, theirs = pair(device)
    lengths = [11, 1, 24, 6]
    docs = [torch.randint(0, 97, (n,), device=device) for n in lengths]
    packed_ids = torch.cat(docs)[None]
    position_ids = torch.cat([torch.arange(n, device=device) for n in lengths])[None]
    with torch.no_grad():
        packed = ours(packed_ids, position_ids=position_ids).logits[0]
        at = 0
        for doc in docs:
            alone_ours = ours(doc[None]).logits[0]
            alone_sdpa = theirs(doc[None]).logits[0]
            torch.testing.assert_close(packed[at:at + doc.numel()], alone_ours, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(packed[at:at + doc.numel()], alone_sdpa, rtol=1e-4, atol=1e-4)
            at += doc.numel()


def test_packing_of_positions_is_computed_once_per_tensor(monkeypatch):
    """Every layer gets the same position_ids: the offsets (a device synchronization each) are found once per
    tensor, and again for a new tensor or after an in-place change, never taken from a stale entry."""
    calls = []
    find = f4hf._offsets_from_position_ids
    monkeypatch.setattr(f4hf, "_offsets_from_position_ids", lambda pos: calls.append(1) or find(pos))
    packing = f4hf._PackingOfPositions()
    positions = torch.tensor([[0, 1, 2, 0, 1]])
    for _ in range(4):  # four layers
        cu, longest = packing(positions, 1)
    assert len(calls) == 1 and cu.tolist() == [0, 3, 5] and longest == 3
    positions[0, 4] = 0  # in place: documents [0, 1, 2], [0], [0]
    assert packing(positions, 1)[0].tolist() == [0, 3, 4, 5] and len(calls) == 2
    del positions
    other = torch.tensor([[0, 1, 0, 1, 2]])  # a new tensor, perhaps at the freed one's address
    assert packing(other, 1)[0].tolist() == [0, 2, 5] and len(calls) == 3
    assert packing(torch.arange(5)[None], 1) is None  # one document: the dense path
    assert packing(torch.tensor([[0, 1], [0, 1]]), 2) is None  # two rows of one document each: not packed
    assert packing(None, 1) is None


def test_unpadding_of_a_mask_is_computed_once_per_tensor_and_shape(monkeypatch):
    """Every layer gets the same padding mask: its packed layout (device synchronizations) is found once per
    tensor and layer shape, and again for a new tensor, another shape or after an in-place change."""
    calls = []
    find = f4hf._unpadding
    monkeypatch.setattr(f4hf, "_unpadding", lambda *a: calls.append(1) or find(*a))
    unpadding = f4hf._Unpadding()
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    for _ in range(4):  # four layers
        cu_q, cu_k, index_q, index_k, longest_q, longest_k = unpadding(mask, 4, 4, True)
    assert len(calls) == 1 and cu_q.tolist() == [0, 3, 7] and cu_k.tolist() == [0, 3, 7]
    assert index_q.tolist() == [1, 2, 3, 4, 5, 6, 7] and (longest_q, longest_k) == (4, 4)
    cu_q = unpadding(mask, 1, 4, True)[0]  # a decode step's shape: the last query of each row
    assert cu_q.tolist() == [0, 1, 2] and len(calls) == 2
    mask[0, 0] = 1  # in place: no padding left
    assert unpadding(mask, 4, 4, True) is None and len(calls) == 3
    del mask
    other = torch.tensor([[1, 1, 0, 0]])  # a new tensor, perhaps at the freed one's address
    assert unpadding(other, 4, 4, False)[1].tolist() == [0, 2] and len(calls) == 4


@pytest.mark.parametrize("device", DEVICES)
def test_training_step_gradients_match_sdpa(device):
    ours, theirs = pair(device)
    ids = torch.randint(0, 97, (2, 33), device=device)
    for model in (ours, theirs):
        model.train()
        model(ids, labels=ids).loss.backward()
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-5, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("device", DEVICES)
def test_packed_training_step_matches_per_document(device):
    """A packed (padding-free) training step's gradients equal the sum of the per-document steps'."""
    ours, _ = pair(device)
    lengths = [9, 17, 4]
    docs = [torch.randint(0, 97, (n,), device=device) for n in lengths]
    ids = torch.cat(docs)[None]
    position_ids = torch.cat([torch.arange(n, device=device) for n in lengths])[None]
    logits = ours(ids, position_ids=position_ids).logits[0]
    loss = sum(torch.nn.functional.cross_entropy(logits[a:a + n - 1], ids[0, a + 1:a + n], reduction="sum")
               for a, n in zip([0, 9, 26], lengths))
    loss.backward()
    packed = [p.grad.clone() for p in ours.parameters()]
    ours.zero_grad()
    for doc in docs:
        logits = ours(doc[None]).logits[0]
        torch.nn.functional.cross_entropy(logits[:-1], doc[1:], reduction="sum").backward()
    for g, p in zip(packed, ours.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-3, atol=1e-5)


def test_value_head_dim_of_its_own_through_every_path():
    # Multi-head latent attention (DeepSeek-V2/V3) hands v narrower than q and k; the padded, cu_seq_lens and
    # packed paths return v's head dim as the dense one does, each row equal to the dense call of its sequence.
    class Module:
        is_causal = True

    torch.manual_seed(0)
    q, k = torch.randn(2, 2, 7, 24), torch.randn(2, 2, 7, 24)  # (batch, heads, seqlen, dim)
    v = torch.randn(2, 2, 7, 16)

    def dense(b, lo, hi):  # one sequence: rows lo .. hi - 1 of batch entry b, in transformers' layout
        out, _ = f4hf.flash4_attention_forward(Module(), q[b:b + 1, :, lo:hi], k[b:b + 1, :, lo:hi],
                                               v[b:b + 1, :, lo:hi], None)
        return out[0]  # (seqlen, heads, 16)

    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, :2] = 0  # left padding
    out, _ = f4hf.flash4_attention_forward(Module(), q, k, v, mask)
    assert out.shape == (2, 7, 2, 16)
    torch.testing.assert_close(out[0], dense(0, 0, 7))
    torch.testing.assert_close(out[1, 2:], dense(1, 2, 7))
    assert torch.equal(out[1, :2], torch.zeros(2, 2, 16))
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    out, _ = f4hf.flash4_attention_forward(Module(), q[:1], k[:1], v[:1], None, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                                           max_length_q=4, max_length_k=4)
    assert out.shape == (1, 7, 2, 16)
    torch.testing.assert_close(out[0, :3], dense(0, 0, 3))
    torch.testing.assert_close(out[0, 3:], dense(0, 3, 7))


@pytest.mark.parametrize("device", DEVICES)
def test_gpt_oss_sinks_and_sliding_window_match_eager(device):
    """gpt-oss attention: learnable sinks (s_aux -> learnable_sink) and sliding-window layers; logits and every
    gradient (the sinks' included) equal eager attention's."""
    if not hasattr(transformers, "GptOssConfig"):
        pytest.skip(f"transformers {transformers.__version__} has no gpt-oss")
    config = transformers.GptOssConfig(vocab_size=97, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_local_experts=4,
                                       num_experts_per_tok=2, sliding_window=8, max_position_embeddings=128,
                                       layer_types=["sliding_attention", "full_attention"])
    torch.manual_seed(0)
    model = transformers.GptOssForCausalLM(config).to(device=device, dtype=torch.float32)
    sinks = [m.sinks for m in model.modules() if hasattr(m, "sinks")]
    assert sinks, "gpt-oss attention without sinks"
    with torch.no_grad():
        for s in sinks:
            s.normal_()
    ids = torch.randint(0, 97, (2, 21), device=device)
    results = []
    for implementation in ("eager", f4hf.register()):
        model.set_attn_implementation(implementation)
        model.zero_grad()
        out = model(ids, labels=ids)
        out.loss.backward()
        results.append((out.logits.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-4, atol=1e-4)
    for a, b in zip(results[1][1], results[0][1]):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5)
    assert all(s.grad is not None and s.grad.abs().sum() > 0 for s in sinks)


GPU = pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability(0)[0] == 9),
                         reason="needs a Hopper (sm_90) GPU")


def gpu_llama_triplet():
    """The fp32 model with SDPA (the judge) and bf16 copies of its weights with flash4 and with SDPA. head_dim 64:
    the GPU kernels run bf16 / fp16 with head dims 64..256."""
    config = transformers.LlamaConfig(vocab_size=97, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                      max_position_embeddings=1024, attention_dropout=0.0)
    torch.manual_seed(0)
    judge = transformers.LlamaForCausalLM(copy.deepcopy(config))
    judge.set_attn_implementation("sdpa")
    judge = judge.to(device="cuda", dtype=torch.float32)
    copies = []
    for implementation in (f4hf.register(), "sdpa"):
        # A config of its own: set_attn_implementation writes the config, and one shared by the three models
        # would leave all of them on the last implementation set.
        model = transformers.LlamaForCausalLM(copy.deepcopy(config))
        model.set_attn_implementation(implementation)
        model.load_state_dict(judge.state_dict())
        copies.append(model.to(device="cuda", dtype=torch.bfloat16))
    for model, implementation in ((judge, "sdpa"), (copies[0], "f4"), (copies[1], "sdpa")):
        assert model.config._attn_implementation == implementation
    return judge, copies[0], copies[1]


def relative_error(x, reference):
    return ((x.float() - reference).norm() / reference.norm()).item()


def assert_as_close_as_sdpa(ours, sdpa, reference, what):
    """flash4's bf16 result is within twice bf16 SDPA's distance from the fp32 result, plus bf16's unit roundoff
    (a wrong mask or a dropped sequence is off by O(1))."""
    e_ours, e_sdpa = relative_error(ours, reference), relative_error(sdpa, reference)
    assert e_ours <= 2 * e_sdpa + 2.0 ** -8, f"{what}: flash4 {e_ours:.3g}, SDPA {e_sdpa:.3g} from fp32"


@GPU
def test_gpu_bf16_logits_padded_and_packed_as_close_as_sdpa():
    judge, ours, sdpa = gpu_llama_triplet()
    ids = torch.randint(0, 97, (2, 300), device="cuda")
    mask = torch.ones_like(ids)
    mask[1, 211:] = 0  # right padding
    with torch.no_grad():
        reference = judge(ids, attention_mask=mask).logits
        keep = mask.bool()
        assert_as_close_as_sdpa(ours(ids, attention_mask=mask).logits[keep], sdpa(ids, attention_mask=mask).logits[keep],
                                reference[keep], "padded logits")
        # Padding-free packing through the varlen path: each document's logits as on its own.
        lengths = [100, 1, 37, 257]
        docs = [torch.randint(0, 97, (n,), device="cuda") for n in lengths]
        position_ids = torch.cat([torch.arange(n, device="cuda") for n in lengths])[None]
        packed = ours(torch.cat(docs)[None], position_ids=position_ids).logits[0]
        at = 0
        for doc in docs:
            alone = judge(doc[None]).logits[0]
            assert_as_close_as_sdpa(packed[at:at + doc.numel()], sdpa(doc[None]).logits[0], alone,
                                    f"packed logits, document of {doc.numel()}")
            at += doc.numel()


@GPU
def test_gpu_bf16_left_padded_generation_steps_as_close_as_sdpa():
    """A left-padded prompt batch and decode steps of 1 and 4 tokens against the KV cache, bf16 against the fp32
    model, as close as bf16 SDPA."""
    judge, ours, sdpa = gpu_llama_triplet()
    ids = torch.randint(1, 97, (3, 200), device="cuda")
    mask = torch.ones_like(ids)
    mask[1, :77] = 0
    mask[2, :199] = 0
    steps = [torch.randint(1, 97, (3, n), device="cuda") for n in (1, 4, 1)]
    cache_arg = "cache" if "cache" in inspect.signature(ours.forward).parameters else "past_key_values"
    caches = {id(model): transformers.DynamicCache() for model in (judge, ours, sdpa)}
    m = mask
    with torch.no_grad():
        for step, chunk in enumerate([ids] + steps):
            if step > 0:
                m = torch.cat([m, torch.ones_like(chunk)], dim=1)
            a, b, reference = (model(chunk, attention_mask=m, use_cache=True, **{cache_arg: caches[id(model)]}).logits
                               for model in (ours, sdpa, judge))
            keep = mask.bool() if step == 0 else torch.ones(a.shape[:2], dtype=torch.bool, device="cuda")
            assert_as_close_as_sdpa(a[keep], b[keep], reference[keep], f"generation step {step}")


@GPU
def test_gpu_bf16_training_step_gradients_as_close_as_sdpa():
    judge, ours, sdpa = gpu_llama_triplet()
    ids = torch.randint(0, 97, (2, 257), device="cuda")
    for model in (judge, ours, sdpa):
        model.train()
        model(ids, labels=ids).loss.backward()
    for (name, g), a, b in zip(judge.named_parameters(), ours.parameters(), sdpa.parameters()):
        assert_as_close_as_sdpa(a.grad, b.grad, g.grad, name)
