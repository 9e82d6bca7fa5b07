"""Argument checks made in Python before the native layer: the options' types and ranges, and that the arrays
are of one kind (all torch tensors or none) and, for torch, on a device flash4 runs on. Without them nanobind
would answer with its own signature dump, or round and truncate silently; the messages name the argument as
the C++ library's do, and the library still validates everything else (shapes, dtypes, strides, aliasing)."""

import math
import operator
import sys

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
_FLOAT32_MAX = 3.4028234663852886e38


def _torch_tensor_type():
    torch = sys.modules.get("torch")  # nothing is a torch tensor unless torch was imported
    return None if torch is None else torch.Tensor


def _sym_int(value):
    """Whether value is a torch.SymInt: a Python int argument that torch.compile traces symbolically (one that
    changed between calls, or any with dynamic=True)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.SymInt)


def _as_int(value, what):
    """value as an int (anything with __index__: numpy and torch integers too); TypeError naming `what` for a
    bool, a float (never truncated) or a non-number. A torch.SymInt is returned as it is: __index__ would
    specialize it to its current value, so a traced int that changes (a varlen max_seqlen, a decode position)
    would recompile the graph on every new value; range checks on it only compare. (Dynamo traces a SymInt
    argument as an int, which therefore is returned without __index__ too.)"""
    if (isinstance(value, int) and not isinstance(value, bool)) or _sym_int(value):
        return value
    if not isinstance(value, bool):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise TypeError(f"{what}; got {type(value).__name__} {value!r}")


def integer(name, value, lo, hi=INT32_MAX, kind="an int"):
    """value as an int in [lo, hi]; TypeError (saying it must be `kind`) for a non-integer, ValueError out of
    range."""
    x = _as_int(value, f"{name} must be {kind}")
    if x < lo:
        raise ValueError(f"{name} = {x} must be >= {lo}")
    if x > hi:
        raise ValueError(f"{name} = {x} must be <= {hi}")
    return x


def window(window_size):
    """(left, right) as ints in [-1, 2**31 - 1], a side of None (FlashAttention 4's spelling of unbounded) as -1;
    TypeError for a non-integer, ValueError out of range."""
    if type(window_size) is tuple and len(window_size) == 2:  # the common case, without the general checks
        left, right = window_size
        if type(left) is int and type(right) is int and -1 <= left <= INT32_MAX and -1 <= right <= INT32_MAX:
            return left, right
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise ValueError(f"window_size must be a pair (left, right) with -1 = unbounded, got {window_size!r}")
    sides = []
    for name, value in zip(("window_left", "window_right"), window_size):
        if value is None:
            sides.append(-1)
            continue
        side = _as_int(value, f"{name} (in window_size) must be an int, -1 or None = unbounded")
        if side < -1:
            raise ValueError(f"{name} = {side} must be >= -1 (-1 = unbounded)")
        if side > INT32_MAX:
            raise ValueError(f"{name} = {side} must be <= {INT32_MAX}")
        sides.append(side)
    return sides[0], sides[1]


def real(name, value):
    """value as a float; TypeError unless it is a real number, ValueError beyond float32's range or for a nonzero
    value that float32 rounds to 0, which the library reads as "default" or "off" (it takes float32; NaN and the
    sign are left to its own checks). A torch tensor that requires grad (a learnable temperature) is refused: the
    library takes the option as a constant, so it would silently get no gradient."""
    if type(value) is float and (value == 0.0 or 2.0**-150 < abs(value) <= _FLOAT32_MAX):  # the common case
        return value
    if isinstance(value, (bool, str, bytes)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    tensor = _torch_tensor_type()
    if isinstance(value, tensor or ()) and value.requires_grad and sys.modules["torch"].is_grad_enabled():
        raise TypeError(f"{name} is a tensor that requires grad, but flash4 takes it as a constant and gives it no "
                        "gradient: pass a float (or value.item()), or scale q by a learnable factor instead")
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}") from None
    # Comparisons only: under torch.compile a Python float option may be a symbolic float, which they turn
    # into guards and math.isfinite or struct would break the graph on. NaN and the infinities are left to the
    # library; a magnitude of at most 2^-150 is exactly what float32 rounds to 0 (to nearest, ties to even).
    if x == x and abs(x) != math.inf and abs(x) > _FLOAT32_MAX:
        raise ValueError(f"{name} = {x!r} is beyond float32's range (the library computes in float32)")
    if x != 0.0 and abs(x) <= 2.0**-150:
        raise ValueError(f"{name} = {x!r} rounds to 0 in float32, which the library reads as the default (or off)")
    return x


def arrays(allow_meta=False, **named):
    """Arrays of one kind: all torch tensors or none (None entries are skipped), torch tensors on cpu or cuda,
    or with allow_meta all on the meta device (whose outputs' shapes the torch custom ops' fake implementations
    give). The first named array sets the kind."""
    tensor = _torch_tensor_type()
    first = None
    for name, x in named.items():
        if x is None:
            continue
        is_torch = tensor is not None and isinstance(x, tensor)
        if first is None:
            first = (name, is_torch)
        elif is_torch != first[1]:
            first_type = type(named[first[0]]) if is_torch else type(x)
            kind = f"{first_type.__module__}.{first_type.__name__}"
            if is_torch:
                message = f"{name} is a torch.Tensor but {first[0]} is a {kind}"
            else:
                message = f"{name} must be a torch.Tensor like {first[0]}, got {kind}"
            raise TypeError(f"{message}; pass all arrays as torch tensors or none of them")
        if is_torch and not (x.is_cuda or x.is_cpu) and not _all_meta(allow_meta, named):
            also = " (or, for output shapes only, all on meta)" if allow_meta else ""
            raise ValueError(f"{name} is on the {x.device.type} device; flash4 runs on cpu and cuda tensors{also}")


def _all_meta(allow_meta, named):
    """Whether meta tensors are allowed and every array given is one."""
    return allow_meta and all(getattr(x, "is_meta", False) for x in named.values() if x is not None)


def dlpack(**named):
    """Arrays the native layer takes (anything with __dlpack__: numpy, torch, other DLPack arrays): TypeError
    naming the argument for anything else (a list, a float), where the binding would answer with its whole
    signature. None entries are skipped."""
    for name, x in named.items():
        if x is not None and not hasattr(x, "__dlpack__"):
            raise TypeError(f"{name} must be an array (torch tensor, numpy array or another DLPack array), got "
                            f"{type(x).__name__}")


def writable(**named):
    """Output arrays the library writes into: a read-only numpy array (flags.writeable False) is refused by
    name here, where the binding would answer with its whole signature. None entries are skipped."""
    for name, x in named.items():
        flags = getattr(x, "flags", None)
        if x is not None and flags is not None and getattr(flags, "writeable", True) is False:
            raise ValueError(f"{name} is a read-only array; flash4 writes its result into {name}")
