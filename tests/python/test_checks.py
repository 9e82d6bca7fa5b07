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
