"""Activation functions by the names config files use."""
import torch
import torch.nn.functional as F


def get_activation(name: str):
    name = (name or "gelu").lower()
    table = {
        "gelu": F.gelu,
        "gelu_python": F.gelu,
        "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
        "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
        "gelu_fast": lambda x: F.gelu(x, approximate="tanh"),
        "relu": F.relu,
        "silu": F.silu,
        "swish": F.silu,
        "tanh": torch.tanh,
        "sigmoid": torch.sigmoid,
        "identity": lambda x: x,
    }
    if name not in table:
        raise ValueError(f"Unsupported activation {name!r}; supported: {sorted(table)}.")
    return table[name]
