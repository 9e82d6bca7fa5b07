"""flash4 on numpy arrays (the CPU path through DLPack): forward vs the fp64 reference, layouts, errors."""

import zlib

import numpy as np
import pytest

import flash4
from attention_reference import EXP2_POLY_RELATIVE_ERROR, attention, check_tolerance

DTYPES = {"float32": np.float32, "float16": np.float16}

# (batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim)
SHAPES = [
    (1, 1, 1, 1, 1, 64),
    (2, 17, 17, 4, 4, 64),
    (1, 127, 129, 4, 2, 64),  # GQA 2:1, odd lengths
    (2, 100, 37, 8, 2, 128),  # seqlen_q > seqlen_k
    (1, 37, 300, 8, 1, 96),  # MQA, seqlen_q < seqlen_k
    (1, 64, 64, 2, 2, 256),
    (1, 200, 200, 2, 2, 32),
]

# (causal, window, softcap)
MASKS = [
    (False, (-1, -1), 0.0),
    (True, (-1, -1), 0.0),
    (False, (16, 0), 0.0),
    (False, (8, 8), 0.0),
    (True, (24, -1), 0.0),
    (False, (-1, -1), 5.0),
    (True, (-1, -1), 5.0),
]


def make_inputs(rng, shape, dtype, spread=1.0):
    batch, sq, sk, h, hk, d = shape
    q = (rng.standard_normal((batch, sq, h, d)) * spread).astype(dtype)
    k = (rng.standard_normal((batch, sk, hk, d)) * spread).astype(dtype)
    v = rng.standard_normal((batch, sk, hk, d)).astype(dtype)
    return q, k, v


def check_against_reference(q, k, v, out, lse, dtype_name, extra_out=0.0, extra_lse=0.0, **options):
    ref_out, ref_lse = attention(q, k, v, **options)
    naive_out, naive_lse = attention(q, k, v, round_to=DTYPES[dtype_name], **options)
    check_tolerance("out", out, ref_out, naive_out, dtype_name, extra_out)
    check_tolerance("lse", lse, ref_lse, naive_lse, "float32", extra_lse)


@pytest.mark.parametrize("dtype_name", sorted(DTYPES))
@pytest.mark.parametrize("mask", MASKS, ids=lambda m: f"causal{int(m[0])}-w{m[1][0]}_{m[1][1]}-cap{m[2]:g}")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_forward_matches_reference(shape, mask, dtype_name):
    causal, window, softcap = mask
    rng = np.random.default_rng(zlib.crc32(repr((shape, mask, dtype_name)).encode()))
    q, k, v = make_inputs(rng, shape, DTYPES[dtype_name], spread=1.5)
    out, lse = flash4.flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=softcap, return_lse=True)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (shape[0], shape[3], shape[1]) and lse.dtype == np.float32
    check_against_reference(q, k, v, out, lse, dtype_name, causal=causal, window=window, softcap=softcap)


def test_softmax_scale_and_return_forms():
    rng = np.random.default_rng(1)
    q, k, v = make_inputs(rng, (2, 33, 40, 4, 2, 64), np.float32)
    out = flash4.flash_attn_func(q, k, v, softmax_scale=0.3)
    assert isinstance(out, np.ndarray)
    out2, lse = flash4.flash_attn_func(q, k, v, softmax_scale=0.3, return_attn_probs=True)
    np.testing.assert_array_equal(out, out2)
    check_against_reference(q, k, v, out2, lse, "float32", softmax_scale=0.3)


def test_fully_masked_rows_give_zero_and_minus_inf():
    # causal with seqlen_q > seqlen_k: the first seqlen_q - seqlen_k query rows see no key.
    rng = np.random.default_rng(2)
    q, k, v = make_inputs(rng, (1, 20, 5, 2, 2, 64), np.float32)
    out, lse = flash4.flash_attn_func(q, k, v, causal=True, return_lse=True)
    assert np.all(out[:, :15] == 0)
    assert np.all(np.isneginf(lse[:, :, :15]))
    assert np.all(np.isfinite(lse[:, :, 15:]))
    check_against_reference(q, k, v, out, lse, "float32", causal=True)


def test_large_logits_stay_finite():
    # Scores spanning hundreds of units: the online softmax must not overflow (conditional rescaling).
    rng = np.random.default_rng(3)
    q, k, v = make_inputs(rng, (1, 64, 300, 2, 2, 64), np.float32, spread=6.0)
    out, lse = flash4.flash_attn_func(q, k, v, return_lse=True)
    assert np.isfinite(out).all() and np.isfinite(lse).all()
    check_against_reference(q, k, v, out, lse, "float32")


def test_strided_inputs_match_contiguous():
    rng = np.random.default_rng(4)
    batch, seqlen, heads, heads_kv, dim = 2, 45, 4, 2, 64
    qkv = rng.standard_normal((batch, seqlen, heads + 2 * heads_kv, dim)).astype(np.float32)
    q, k, v = qkv[:, :, :heads], qkv[:, :, heads : heads + heads_kv], qkv[:, :, heads + heads_kv :]
    assert not q.flags.c_contiguous
    strided = flash4.flash_attn_func(q, k, v, causal=True)
    contiguous = flash4.flash_attn_func(*(np.ascontiguousarray(t) for t in (q, k, v)), causal=True)
    np.testing.assert_array_equal(strided, contiguous)
    # (batch, heads, seqlen, dim) storage seen through a transposed view, as SDPA-layout callers have it.
    q_bhsd = np.ascontiguousarray(q.transpose(0, 2, 1, 3))
    transposed = flash4.flash_attn_func(q_bhsd.transpose(0, 2, 1, 3), k, v, causal=True)
    np.testing.assert_array_equal(transposed, contiguous)


def test_read_only_inputs():
    rng = np.random.default_rng(5)
    q, k, v = make_inputs(rng, (1, 16, 16, 2, 2, 64), np.float32)
    expected = flash4.flash_attn_func(q, k, v)
    for t in (q, k, v):
        t.flags.writeable = False
    np.testing.assert_array_equal(flash4.flash_attn_func(q, k, v), expected)


def test_read_only_outputs_are_named():
    rng = np.random.default_rng(5)
    q, k, v = make_inputs(rng, (1, 16, 16, 2, 2, 64), np.float32)
    out = np.full(q.shape, np.nan, dtype=np.float32)
    lse = np.full((1, 2, 16), np.nan, dtype=np.float32)
    for name in ("out", "lse"):
        arrays = dict(out=out.copy(), lse=lse.copy())
        arrays[name].flags.writeable = False
        with pytest.raises(ValueError, match=f"{name} is a read-only array"):
            flash4.forward(q, k, v, arrays["out"], arrays["lse"])
        assert np.isnan(arrays["out"]).all() and np.isnan(arrays["lse"]).all()  # nothing written
    flash4.forward(q, k, v, out, lse)
    grads = {name: np.full(t.shape, np.nan, dtype=np.float32) for name, t in (("dq", q), ("dk", k), ("dv", v))}
    for name in grads:
        given = {n: g.copy() for n, g in grads.items()}
        given[name].flags.writeable = False
        with pytest.raises(ValueError, match=f"{name} is a read-only array"):
            flash4.backward(np.ones_like(out), q, k, v, out, lse, given["dq"], given["dk"], given["dv"])
        assert all(np.isnan(g).all() for g in given.values())


@pytest.mark.parametrize("exp2", ["auto", "exact", "polynomial"])
@pytest.mark.parametrize("conditional_rescale", [True, False])
def test_low_level_forward_tuning(exp2, conditional_rescale):
    rng = np.random.default_rng(6)
    q, k, v = make_inputs(rng, (1, 100, 150, 4, 2, 64), np.float32, spread=2.0)
    out = np.full(q.shape, np.nan, dtype=np.float32)
    lse = np.full((1, 4, 100), np.nan, dtype=np.float32)
    flash4.forward(q, k, v, out, lse, causal=True, exp2=exp2, conditional_rescale=conditional_rescale)
    ref_out, _ = attention(q, k, v, causal=True)
    poly = exp2 == "polynomial"
    check_against_reference(
        q, k, v, out, lse, "float32",
        extra_out=2 * EXP2_POLY_RELATIVE_ERROR * np.abs(ref_out).max() if poly else 0.0,
        extra_lse=EXP2_POLY_RELATIVE_ERROR if poly else 0.0,
        causal=True,
    )


def test_low_level_forward_without_lse():
    rng = np.random.default_rng(7)
    q, k, v = make_inputs(rng, (1, 10, 12, 2, 1, 32), np.float16)
    out = np.zeros_like(q)
    flash4.forward(q, k, v, out)
    np.testing.assert_array_equal(out, flash4.flash_attn_func(q, k, v))


def test_low_level_backward_on_numpy():
    rng = np.random.default_rng(8)
    q, k, v = make_inputs(rng, (1, 9, 11, 2, 1, 32), np.float32)
    out, lse = flash4.flash_attn_func(q, k, v, return_lse=True)
    dout = rng.standard_normal(out.shape).astype(np.float32)
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    flash4.backward(dout, q, k, v, out, lse, dq, dk, dv)
    # Finite differences along one direction of q, in float64 through the reference.
    direction = rng.standard_normal(q.shape)
    eps = 1e-4
    plus, _ = attention(q + eps * direction, k, v)
    minus, _ = attention(q - eps * direction, k, v)
    numeric = np.sum(dout * (plus - minus) / (2 * eps))
    assert np.isclose(np.sum(dq * direction), numeric, rtol=1e-3, atol=1e-3)
    assert np.isfinite(dk).all() and np.isfinite(dv).all()


@pytest.mark.parametrize(
    "batch,seqlen_q,seqlen_k", [(0, 8, 8), (2, 0, 8), (2, 8, 0)], ids=["batch0", "seqlen_q0", "seqlen_k0"]
)
def test_empty_problems(batch, seqlen_q, seqlen_k):
    q = np.ones((batch, seqlen_q, 2, 32), np.float32)
    k = np.ones((batch, seqlen_k, 2, 32), np.float32)
    out, lse = flash4.flash_attn_func(q, k, k, return_lse=True)
    assert out.shape == q.shape and lse.shape == (batch, 2, seqlen_q)
    if seqlen_k == 0:  # every row fully masked
        assert np.all(out == 0) and np.all(np.isneginf(lse))


def test_info_functions():
    assert flash4.__version__ == flash4.library_version() == "0.1.0"
    assert isinstance(flash4.cuda_available(), bool)
    rng = np.random.default_rng(9)
    q, k, v = make_inputs(rng, (1, 8, 8, 2, 2, 64), np.float32)
    support = flash4.can_implement(q, k, v, causal=True)
    assert support and support.ok and support.reason == ""
    assert flash4.can_implement(q, k, v, backward=True)


# ---- errors: the library's message reaches Python as the matching exception ----------------------------------


def _qkv(dtype=np.float32, shape=(1, 8, 2, 64)):
    rng = np.random.default_rng(10)
    return [rng.standard_normal(shape).astype(dtype) for _ in range(3)]


def test_error_wrong_rank():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="q must have 4 dimensions"):
        flash4.flash_attn_func(q[0], k, v)


def test_error_not_an_array():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="q must be an array"):
        flash4.flash_attn_func(q.tolist(), k, v)


@pytest.mark.parametrize("dtype", [np.float64, np.int32])
def test_error_unsupported_dtype(dtype):
    q, k, v = _qkv(dtype)
    with pytest.raises(TypeError, match="q has dtype .*flash4 takes float32, float16 or bfloat16"):
        flash4.flash_attn_func(q, k, v)


def test_error_dtype_mismatch():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match=r"k\.dtype is fp16 but q\.dtype is fp32"):
        flash4.flash_attn_func(q, k.astype(np.float16), v)


def test_error_heads_not_divisible():
    q, _, _ = _qkv(shape=(1, 8, 3, 64))
    _, k, v = _qkv(shape=(1, 8, 2, 64))
    with pytest.raises(ValueError, match="heads_kv"):
        flash4.flash_attn_func(q, k, v)


def test_error_head_dim():
    q, k, v = _qkv(shape=(1, 8, 2, 12))
    with pytest.raises(ValueError, match="head_dim must be a multiple of 8"):
        flash4.flash_attn_func(q, k, v)


def test_error_non_contiguous_last_dim():
    q, k, v = _qkv(shape=(1, 8, 2, 128))
    with pytest.raises(ValueError, match="last dimension must be contiguous"):
        flash4.flash_attn_func(q[..., ::2], k[..., ::2], v[..., ::2])


def test_error_batch_mismatch():
    q, _, _ = _qkv(shape=(2, 8, 2, 64))
    _, k, v = _qkv()
    with pytest.raises(ValueError, match="batch"):
        flash4.flash_attn_func(q, k, v)


@pytest.mark.parametrize(
    "options,pattern",
    [
        ({"window_size": (-2, 0)}, "window_left"),
        ({"window_size": (0, -5)}, "window_right"),
        ({"window_size": (3,)}, "window_size must be a pair"),
        ({"softcap": -1.0}, "softcap"),
        ({"softmax_scale": float("nan")}, "softmax_scale"),
        ({"softmax_scale": -1.0}, "softmax_scale"),
    ],
)
def test_error_bad_options(options, pattern):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=pattern):
        flash4.flash_attn_func(q, k, v, **options)


@pytest.mark.parametrize("options", [{"dropout_p": 0.1}, {"alibi_slopes": np.zeros(2)}])
def test_error_unimplemented_features(options):
    q, k, v = _qkv()
    with pytest.raises(NotImplementedError):
        flash4.flash_attn_func(q, k, v, **options)


def test_error_output_aliases_input_and_is_untouched():
    q, k, v = _qkv()
    before = q.copy()
    with pytest.raises(ValueError, match="overlaps"):
        flash4.forward(q, k, v, q)
    np.testing.assert_array_equal(q, before)


def test_error_output_shape():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="out must have the shape of q"):
        flash4.forward(q, k, v, np.empty((1, 7, 2, 64), np.float32))
    with pytest.raises(ValueError, match=r"out.shape\[3\] \(head_dim\) = 32 but v.shape\[3\] = 64"):
        flash4.forward(q, k, v, np.empty((1, 8, 2, 32), np.float32))  # out takes v's head dim


def test_error_lse_dtype():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="lse.dtype"):
        flash4.forward(q, k, v, np.empty_like(q), np.empty((1, 2, 8), np.float16))


def test_error_exp2_mode():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="exp2"):
        flash4.forward(q, k, v, np.empty_like(q), exp2="fast")
