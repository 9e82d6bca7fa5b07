"""The devices the torch tests run on: the CPU always, a Hopper (sm_90) GPU where one is present (import after
pytest.importorskip("torch"))."""

import pytest
import torch


def hopper_present():
    return torch.cuda.is_available() and torch.cuda.get_device_capability(0)[0] == 9


CUDA = pytest.param(
    "cuda", marks=pytest.mark.skipif(not hopper_present(), reason="needs a Hopper (sm_90) GPU"), id="cuda"
)
DEVICES = [pytest.param("cpu", id="cpu"), CUDA]
