"""The ring's communication on torch.distributed: the group and its neighbours, the check that every rank makes
the same call, and the asynchronous exchange of tensors with the neighbours (batch_isend_irecv), which the
attention overlaps with its computation."""

import datetime
import struct
from typing import List, Sequence

import torch
import torch.distributed as dist

_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


class Ring:
    """This rank's place in the ring of a process group, and its exchange with the neighbours."""

    def __init__(self, group, rank, world_size, next_rank, prev_rank, timeout):
        self.group = group
        self.rank = rank  # in the group
        self.world_size = world_size
        self.next_rank = next_rank  # global ranks of the neighbours (point-to-point ops take global ranks)
        self.prev_rank = prev_rank
        self.timeout = timeout  # datetime.timedelta for waits; None = the group's own timeout

    def wait(self, work):
        if self.timeout is None:
            work.wait()
        else:
            work.wait(self.timeout)

    def start_exchange(self, tensors: Sequence[torch.Tensor], tag: int, receive_rows=None) -> "PendingExchange":
        """Sends `tensors` (contiguous) to the next rank and receives tensors of the same shapes and dtypes
        from the previous one, asynchronously (with receive_rows: of that many rows in dimension 0, for the
        packed shards, whose lengths differ from rank to rank). `tag` separates the ring's message streams
        (K/V, dK/dV) on backends that match messages by tag; streams started in the same order on every rank
        also match on those that do not (NCCL)."""
        if receive_rows is None:
            received = [torch.empty_like(t) for t in tensors]
        else:
            received = [t.new_empty((receive_rows,) + tuple(t.shape[1:])) for t in tensors]
        ops = [dist.P2POp(dist.isend, t, self.next_rank, self.group, tag) for t in tensors]
        ops += [dist.P2POp(dist.irecv, r, self.prev_rank, self.group, tag) for r in received]
        return PendingExchange(dist.batch_isend_irecv(ops), received, self)


def pair_error(q, k, v):
    """The message of the first mismatch between one rank's q, k and v tensors that flash4 would refuse, or None.
    Checked before the ring starts: a rank whose shard holds no token makes no flash4 call, so an error raised
    by the calls would reach some ranks and leave the others waiting on the ring."""
    dims = q.dim()
    if q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return f"q has dtype {q.dtype}; ring attention takes float32, float16 or bfloat16"
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            return f"{name}.dtype is {t.dtype} but q.dtype is {q.dtype}; they must match"
    if dims == 4 and not q.shape[0] == k.shape[0] == v.shape[0]:
        return f"q, k and v must share the batch size, got {q.shape[0]}, {k.shape[0]} and {v.shape[0]}"
    heads, heads_kv = q.shape[-2], k.shape[-2]
    if v.shape[-2] != heads_kv:
        return f"v has {v.shape[-2]} heads but k has {heads_kv}; they must match"
    if heads_kv < 1 or heads % heads_kv != 0:
        return f"q has {heads} heads, k and v {heads_kv}; GQA/MQA needs heads % heads_kv == 0"
    if k.shape[-1] != q.shape[-1]:
        return f"k.shape[-1] (head_dim) = {k.shape[-1]} but q.shape[-1] = {q.shape[-1]}; q and k must share head_dim"
    return None


def make_ring(group, timeout, caller):
    if not dist.is_available():
        raise RuntimeError(f"{caller}: this torch build has no torch.distributed")
    if not dist.is_initialized():
        raise RuntimeError(
            f"{caller}: torch.distributed is not initialized; call torch.distributed.init_process_group first "
            "(backend 'nccl' for CUDA tensors, 'gloo' for CPU tensors) on every rank"
        )
    if group is not None and group == dist.GroupMember.NON_GROUP_MEMBER:
        raise ValueError(f"{caller}: this process is not a member of `group`")
    if timeout is not None and not isinstance(timeout, datetime.timedelta):
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ValueError(f"{caller}: timeout must be a datetime.timedelta or positive seconds, got {timeout!r}")
        timeout = datetime.timedelta(seconds=float(timeout))
    rank = dist.get_rank(group)
    world_size = dist.get_world_size(group)

    def global_rank(r):
        return r if group is None else dist.get_global_rank(group, r)

    return Ring(group, rank, world_size, global_rank((rank + 1) % world_size),
                global_rank((rank - 1) % world_size), timeout)


def _float_bits(x):
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


def call_signature(q, k, v, options: dict, shape_dims=(0, 1, 2, 3)) -> List[tuple]:
    """(name, int value) pairs that must be equal on every rank of the ring for one call (of the shapes, the
    dimensions shape_dims: a packed shard's token count differs from rank to rank)."""
    fields = []
    for name, t in (("q", q), ("k", k), ("v", v)):
        is_tensor = isinstance(t, torch.Tensor)
        fields.append((f"{name} is a torch.Tensor", int(is_tensor)))
        dims = t.dim() if is_tensor else -1
        fields.append((f"{name}.dim()", dims))
        shape = list(t.shape) if is_tensor else []
        for d, size in enumerate((shape + [-1] * 4)[:4]):
            if d in shape_dims:
                fields.append((f"{name}.shape[{d}]", size))
        fields.append((f"{name}.dtype", _DTYPES.index(t.dtype) if is_tensor and t.dtype in _DTYPES else -1))
        fields.append((f"{name}.device.type", ("cpu", "cuda").index(t.device.type)
                       if is_tensor and t.device.type in ("cpu", "cuda") else -1))
    for name, value in options.items():
        if isinstance(value, float):
            fields.append((name, _float_bits(value)))
        elif isinstance(value, str):
            fields.append((name, int.from_bytes(value.encode()[:8].ljust(8, b"\0"), "little", signed=True)))
        else:
            fields.append((name, int(value)))
    return fields


def _describe(name, value):
    if name.endswith(".dtype"):
        return str(_DTYPES[value]) if 0 <= value < len(_DTYPES) else "unsupported"
    if name.endswith(".device.type"):
        return ("cpu", "cuda")[value] if value in (0, 1) else "other"
    if name in ("softmax_scale", "softcap"):
        return repr(struct.unpack("<d", struct.pack("<q", value))[0])
    if name == "layout":
        return repr(value.to_bytes(8, "little", signed=True).rstrip(b"\0").decode(errors="replace"))
    return str(value)


_MESSAGE_WORDS = 64  # int64 words (512 bytes) of a rank's own error message that travel with its signature


def _encode_message(message):
    data = (message or "").encode()[: 8 * _MESSAGE_WORDS].ljust(8 * _MESSAGE_WORDS, b"\0")
    return list(struct.unpack(f"<{_MESSAGE_WORDS}q", data))


def _decode_message(words):
    data = struct.pack(f"<{_MESSAGE_WORDS}q", *words)
    return data.rstrip(b"\0").decode(errors="replace")


def check_same_call(ring: Ring, signature: List[tuple], device, caller, local_error=None):
    """Raises ValueError on every rank when the ranks' signatures differ (an all_gather on the group), naming
    the first field that differs and each rank's value; then, in the same all_gather, when a rank found its
    own arguments invalid (local_error: its message, checks whose outcome may differ between ranks), with
    every such rank's message."""
    values = torch.tensor([v for _, v in signature] + _encode_message(local_error), dtype=torch.int64)
    backend = dist.get_backend(ring.group)
    if backend == "nccl":
        values = values.to(device if device.type == "cuda" else torch.device("cuda", torch.cuda.current_device()))
    gathered = [torch.empty_like(values) for _ in range(ring.world_size)]
    ring.wait(dist.all_gather(gathered, values, group=ring.group, async_op=True))
    table = torch.stack(gathered).cpu()
    messages = table[:, len(signature):]
    table = table[:, : len(signature)]
    differs = (table != table[0]).any(dim=0).nonzero()
    if differs.numel() == 0:
        errors = [f"rank {r}: {_decode_message(messages[r].tolist())}" for r in range(ring.world_size)
                  if messages[r].any()]
        if errors:
            raise ValueError(f"{caller}: " + "; ".join(errors))
        return
    field = int(differs[0])
    name = signature[field][0]
    per_rank = ", ".join(f"rank {r}: {_describe(name, int(table[r, field]))}" for r in range(ring.world_size))
    raise ValueError(
        f"{caller}: the ranks of the group disagree on {name} ({per_rank}); every rank must pass shards of the "
        "same shapes, dtype and device type with the same options"
    )


class PendingExchange:
    """Tensors on their way from the previous rank (and ours to the next); wait() returns the received ones."""

    def __init__(self, works, received, ring):
        self._works = works
        self._received = received
        self._ring = ring

    def wait(self) -> List[torch.Tensor]:
        for work in self._works:
            self._ring.wait(work)
        return self._received
