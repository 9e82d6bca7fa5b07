"""Property test (hypothesis) of flash_attn_func's argument handling: for any mix of shapes, dtypes, options and
array kinds, it either returns out shaped like q (and lse shaped (batch, heads, seqlen_q)) or raises TypeError,
ValueError or NotImplementedError with a message that names an argument; never another exception, never
nanobind's signature dump, never a crash."""

import math
import re

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import flash4  # noqa: E402

# A message names an argument: an array, one of its dimensions, or an option.
NAMES_AN_ARGUMENT = re.compile(r"\b(q|k|v|out|lse|window_left|window_right|window_size|softmax_scale|softcap)\b")

sizes = st.integers(min_value=0, max_value=5)
head_dims = st.sampled_from([0, 1, 7, 8, 16, 24, 32, 33, 264])
dtypes = st.sampled_from([np.float32, np.float16, np.float64, np.int32])
window_sides = st.one_of(
    st.integers(min_value=-3, max_value=6),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.floats(allow_nan=True),
    st.sampled_from([None, "1", True]),
)
scalars = st.one_of(
    st.none(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=-1e40, max_value=1e40),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from(["0.5", 1j, True]),
)


@st.composite
def problems(draw):
    batch, sq, sk = draw(sizes), draw(sizes), draw(sizes)
    heads_kv = draw(st.integers(min_value=0, max_value=3))
    heads = heads_kv * draw(st.integers(min_value=1, max_value=2)) + draw(st.sampled_from([0, 0, 0, 1]))
    d = draw(head_dims)
    dtype = draw(dtypes)
    shapes = [(batch, sq, heads, d), (batch, sk, heads_kv, d), (batch, sk, heads_kv, d)]
    # Occasionally one array of another rank or another head_dim.
    bad = draw(st.sampled_from([None] * 6 + [0, 1, 2]))
    if bad is not None:
        shapes[bad] = draw(st.sampled_from([(batch, sq, heads), (batch, sq, heads, d + 8), (1,) * 5]))
    arrays = [np.ones(s, dtype=dtype) for s in shapes]
    if draw(st.booleans()):  # a non-contiguous last dimension
        arrays[0] = np.ones(shapes[0][:-1] + (shapes[0][-1] * 2,), dtype=dtype)[..., ::2]
    return arrays


TORCH = None
try:
    import torch as TORCH  # noqa: N812
except ImportError:  # pragma: no cover - the numpy-only CI mode
    pass


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    arrays=problems(),
    window=st.one_of(st.tuples(window_sides, window_sides), st.sampled_from([(0,), 3, None, "(-1, -1)"])),
    softmax_scale=scalars,
    softcap=scalars,
    causal=st.booleans(),
    return_lse=st.booleans(),
    as_torch=st.sampled_from([(), (), (0,), (1,), (0, 1, 2)]),
)
def test_flash_attn_func_argument_handling(arrays, window, softmax_scale, softcap, causal, return_lse, as_torch):
    if as_torch and TORCH is None:
        as_torch = ()
    q, k, v = (TORCH.from_numpy(np.ascontiguousarray(a)) if i in as_torch else a for i, a in enumerate(arrays))
    try:
        result = flash4.flash_attn_func(q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window,
                                        softcap=softcap, return_lse=return_lse)
    except (TypeError, ValueError, NotImplementedError) as error:
        message = str(error)
        assert message, "an empty message"
        assert "incompatible function arguments" not in message, message
        assert NAMES_AN_ARGUMENT.search(message), message
        return
    out, lse = result if return_lse else (result, None)
    assert tuple(out.shape) == tuple(q.shape)
    if lse is not None:
        batch, seqlen_q, heads, _ = q.shape
        assert tuple(lse.shape) == (batch, heads, seqlen_q)
    # What ran was valid: a window of ints or None (FlashAttention 4's unbounded side), real scalars within
    # float32's range.
    assert all(side is None or (isinstance(side, (int, np.integer)) and not isinstance(side, bool)) for side in window)
    for x in (softmax_scale, softcap):
        assert x is None or (not isinstance(x, (str, bool, complex)) and (not math.isfinite(float(x)) or
                                                                           abs(float(x)) <= 3.5e38))
