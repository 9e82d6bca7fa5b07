"""Python-side argument checks (flash4/_checks.py): option types and ranges, arrays of one kind, torch devices,
and what `import flash4` loads. Each message names the argument."""

import subprocess
import sys

import numpy as np
import pytest

import flash4


def _qkv():
    rng = np.random.default_rng(0)
    return tuple(rng.standard_normal((1, 8, 2, 32)).astype(np.float32) for _ in range(3))


@pytest.mark.parametrize(
    "window,error,pattern",
    [
        ((2**40, 0), ValueError, r"window_left = 1099511627776 must be <= 2147483647"),
        ((0, 2**31), ValueError, r"window_right = 2147483648 must be <= 2147483647"),
        ((-2, 0), ValueError, r"window_left = -2 must be >= -1"),
        ((1.5, 0), TypeError, r"window_left \(in window_size\) must be an int.*1\.5"),
        ((0, "3"), TypeError, r"window_right \(in window_size\) must be an int.*'3'"),
        ((True, 0), TypeError, r"window_left \(in window_size\) must be an int"),
        ((0,), ValueError, r"window_size must be a pair"),
        (5, ValueError, r"window_size must be a pair"),
    ],
)
def test_window_types_and_ranges(window, error, pattern):
    q, k, v = _qkv()
    with pytest.raises(error, match=pattern):
        flash4.flash_attn_func(q, k, v, window_size=window)
    with pytest.raises(error, match=pattern):
        flash4.forward(q, k, v, np.empty_like(q), window_size=window)


def test_window_accepts_numpy_integers():
    q, k, v = _qkv()
    a = flash4.flash_attn_func(q, k, v, window_size=(np.int64(3), np.int32(0)))
    b = flash4.flash_attn_func(q, k, v, window_size=(3, 0))
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "options,error,pattern",
    [
        ({"softmax_scale": "0.5"}, TypeError, r"softmax_scale must be a real number, got str"),
        ({"softmax_scale": 1e300}, ValueError, r"softmax_scale = 1e\+300 is beyond float32's range"),
        ({"softcap": None}, TypeError, r"softcap must be a real number, got NoneType"),
        ({"softcap": 1j}, TypeError, r"softcap must be a real number, got complex"),
        ({"softcap": -1e39}, ValueError, r"softcap = -1e\+39 is beyond float32's range"),
    ],
)
def test_scalar_types_and_ranges(options, error, pattern):
    q, k, v = _qkv()
    with pytest.raises(error, match=pattern):
        flash4.flash_attn_func(q, k, v, **options)


@pytest.mark.parametrize("name", ["softmax_scale", "softcap"])
def test_scalar_tensors_that_require_grad_are_refused(name):
    # A learnable temperature passed as the option would silently never learn: the library takes a constant.
    torch = pytest.importorskip("torch")
    q, k, v = (torch.from_numpy(x) for x in _qkv())
    value = torch.tensor(0.25, requires_grad=True)
    with pytest.raises(TypeError, match=name + r" is a tensor that requires grad, but flash4 takes it as a constant"):
        flash4.flash_attn_func(q, k, v, **{name: value})
    with torch.no_grad():
        flash4.flash_attn_func(q, k, v, **{name: value})
    flash4.flash_attn_func(q, k, v, **{name: value.detach()})


@pytest.mark.parametrize("name", ["softmax_scale", "softcap"])
def test_scalars_that_round_to_zero_are_refused(name):
    # In float32 1e-46 is 0, which means "the default scale" or "no softcap": not what was asked for.
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=name + r" = 1e-46 rounds to 0 in float32"):
        flash4.flash_attn_func(q, k, v, **{name: 1e-46})
    flash4.flash_attn_func(q, k, v, softmax_scale=1e-44, softcap=1e-44)  # float32 subnormals are kept


@pytest.mark.parametrize(
    "max_seqlen,error,pattern",
    [
        (6.5, TypeError, r"max_seqlen_q must be an int; got float 6.5"),
        (None, TypeError, r"max_seqlen_q must be an int; got NoneType None"),
        (True, TypeError, r"max_seqlen_q must be an int; got bool True"),
        (-1, ValueError, r"max_seqlen_q = -1 must be >= 0"),
        (2**40, ValueError, r"max_seqlen_q = 1099511627776 must be <= 2147483647"),
    ],
)
def test_max_seqlen_types_and_ranges(max_seqlen, error, pattern):
    q = np.zeros((10, 2, 32), np.float32)
    cu = np.array([0, 4, 10], np.int32)
    with pytest.raises(error, match=pattern):
        flash4.flash_attn_varlen_func(q, q, q, cu, cu, max_seqlen, 6)
    torch = pytest.importorskip("torch")
    t, tcu = torch.from_numpy(q), torch.from_numpy(cu)
    with pytest.raises(error, match=pattern):
        flash4.flash_attn_varlen_func(t, t, t, tcu, tcu, max_seqlen, 6)
    flash4.flash_attn_varlen_func(t, t, t, tcu, tcu, np.int64(6), torch.tensor(6))  # integer types are ints


def test_empty_offsets_are_named():
    # An offsets tensor without elements is not "no offsets": it would turn a packed call into a dense one.
    q = np.zeros((10, 2, 32), np.float32)
    empty = np.zeros((0,), np.int32)
    cu = np.array([0, 4, 10], np.int32)
    pattern = r"cu_seqlens_k has no elements; it must hold batch \+ 1 offsets starting with 0"
    with pytest.raises(ValueError, match=pattern):
        flash4.flash_attn_varlen_func(q, q, q, cu, empty, 6, 6)
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(q)
    with pytest.raises(ValueError, match=pattern):
        flash4.flash_attn_varlen_func(t, t, t, torch.from_numpy(cu), torch.from_numpy(empty), 6, 6)


def test_import_loads_nn_and_torch_ops():
    pytest.importorskip("torch")
    code = "import flash4, torch; flash4.nn.Attention; torch.ops.flash4.fwd; torch.ops.flash4.bwd; print('ok')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_numpy_and_torch_not_mixed():
    torch = pytest.importorskip("torch")
    q, k, v = _qkv()
    with pytest.raises(TypeError, match=r"k is a torch.Tensor but q is a numpy.ndarray; pass all arrays"):
        flash4.flash_attn_func(q, torch.from_numpy(k), v)
    with pytest.raises(TypeError, match=r"v must be a torch.Tensor like q, got numpy.ndarray; pass all arrays"):
        flash4.flash_attn_func(torch.from_numpy(q), torch.from_numpy(k), v)
    with pytest.raises(TypeError, match=r"out is a torch.Tensor but q is a numpy.ndarray"):
        flash4.forward(q, k, v, torch.empty(q.shape))


def test_meta_device_named():
    torch = pytest.importorskip("torch")
    q, k, v = (torch.from_numpy(x) for x in _qkv())
    with pytest.raises(ValueError, match=r"k is on the meta device; flash4 runs on cpu and cuda tensors"):
        flash4.flash_attn_func(q, k.to("meta"), v)
    with pytest.raises(ValueError, match=r"q is on the meta device"):
        flash4.can_implement(q.to("meta"), k, v)


def test_arguments_that_are_not_arrays_are_named():
    # Where the binding would answer with its whole signature, the message names the argument.
    q, k, v = (x.reshape(8, 2, 32) for x in _qkv())
    with pytest.raises(TypeError, match=r"cu_seqlens_q must be an array .*got list"):
        flash4.flash_attn_varlen_func(q, k, v, [0, 4, 8], np.array([0, 4, 8], np.int32), 4, 4)
    with pytest.raises(TypeError, match=r"v must be an array .*got list"):
        cu = np.array([0, 4, 8], np.int32)
        flash4.flash_attn_varlen_func(q, k, [1.0], cu, cu, 4, 4)
    q4, k4, v4 = _qkv()
    with pytest.raises(TypeError, match=r"learnable_sink must be an array .*got list"):
        flash4.flash_attn_func(q4, k4, v4, learnable_sink=[0.0, 0.0])
    out, lse = flash4.flash_attn_func(q4, k4, v4, return_lse=True)
    grads = [np.empty_like(x) for x in (q4, k4, v4)]
    with pytest.raises(ValueError, match=r"lse is required"):
        flash4.backward(np.ones_like(out), q4, k4, v4, out, None, *grads)


@pytest.mark.parametrize("given", ["cu_seqlens_q", "cu_seqlens_k"])
def test_varlen_needs_both_offsets(given):
    q, k, v = (x.reshape(8, 2, 32) for x in _qkv())
    cu = np.array([0, 4, 8], np.int32)
    offsets = {"cu_seqlens_q": None, "cu_seqlens_k": None, given: cu}
    missing = "cu_seqlens_k" if given == "cu_seqlens_q" else "cu_seqlens_q"
    with pytest.raises(ValueError, match=rf"{given} is set but {missing} is not; a packed batch needs both"):
        flash4.flash_attn_varlen_func(q, k, v, offsets["cu_seqlens_q"], offsets["cu_seqlens_k"], 4, 4)


def test_real_options_round_to_zero_exactly_where_float32_does():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"rounds to 0 in float32"):
        flash4.flash_attn_func(q, k, v, softmax_scale=2.0**-150)
    with pytest.raises(ValueError, match=r"beyond float32's range"):
        flash4.flash_attn_func(q, k, v, softcap=1e39)
    # The smallest float32 (2^-149) and a value just above half of it round to it, not to 0: accepted.
    for scale in (2.0**-149, 2.0**-150 * (1 + 2.0**-30)):
        flash4.flash_attn_func(q, k, v, softmax_scale=scale)
