"""Buffers that a long step's layers share for their widest activations (fp32 on the CPU).

glibc serves an allocation of 32 MiB or more (its largest mmap threshold on 64-bit, which
pooler/worker/memory.py already sets) with a fresh mmap and unmaps it on free, so every such
tensor is faulted in again page by page, and zeroed by the kernel, the next time. At 8,192 tokens
a GTE-base layer made three: the fused q/k/v projection ([8192, 2304], 75 MB), the GeGLU's
[gate | up] ([8192, 6144], 201 MB) and its product ([8192, 3072], 101 MB): ~50k minor faults per
layer, 0.45-1.0M per document, and each such GEMM ran ~10-17% slower than into a buffer it had
written before (docs/dev/journal.md, "Long documents: one workspace per forward").

A Workspace lives for one forward pass: the first layer allocates each buffer and the others
write into the same memory (the layers run one after another and each consumes its buffers
before the next starts). The fused q/k/v and the MLP's input projection share one buffer
("wide"): q/k/v is dead once attention has returned (rotary q and k are copies; v is read by
attention alone), so the workspace holds the larger of the two, not both (a GTE-base 8k step:
201 + 101 MB for [gate | up] and the product, where holding q/k/v too made 377). It is dropped with the forward, so a process's resident memory after
a long document is what it was before (a buffer kept across calls would hold ~300 MB of a
GTE-base 8k step for good). The GEMMs that write into it run torch's `mm`/`addmm` with `out=`
(MKL here; oneDNN's fused linear has no output argument): measured as fast as oneDNN's at these
sizes (768 x 6144 at 8,192 rows: 375 ms into a reused buffer, 452 ms oneDNN into a fresh one, 1
thread, interleaved; 768 x 2304: 146 / 160 ms).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pooler.layers.lora import has_lora

# Steps of fewer tokens keep the fused oneDNN path: their activations are under glibc's mmap
# ceiling (a GTE-base [2048, 6144] block is 50 MB, [1024, 6144] 25 MB) or barely over it.
MIN_ROWS = 2048
# ... and so do steps whose widest block stays under the ceiling itself (glibc already reuses
# those from the heap, memory.py): a BERT-base step of 2,048 tokens ([2048, 3072], 25 MB) keeps
# oneDNN's fused GELU epilogue.
MIN_WIDE_BYTES = 32 * 2**20


class Workspace:
    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    @classmethod
    def for_step(cls, x: torch.Tensor, wide_cols: int) -> "Workspace | None":
        """A workspace for this step's layers (x: [num_tokens, hidden]; wide_cols: the larger
        of the fused q/k/v width and the MLP's input projection width, which share the "wide"
        buffer, reserved here), or None where the layers keep their own allocations (a short
        step or one whose widest block is under the mmap ceiling, not fp32 on the CPU,
        autograd)."""
        rows = x.shape[0]
        if (rows < MIN_ROWS or rows * wide_cols * 4 < MIN_WIDE_BYTES or not x.is_cpu
                or x.dtype != torch.float32 or torch.is_grad_enabled()):
            return None
        workspace = cls()
        workspace.reserve("wide", rows, wide_cols)
        return workspace

    def reserve(self, name: str, rows: int, cols: int) -> None:
        """Allocate buffer `name` for [rows, cols] now: a buffer two users of different widths
        share (q/k/v, then the MLP's input projection) is made once at the larger width, not
        made at the first width and again at the second."""
        self.take(name, rows, cols)

    def take(self, name: str, rows: int, cols: int) -> torch.Tensor:  # [rows, cols] fp32
        """The buffer `name` as [rows, cols], allocated on the first call (contents are
        whatever the last user left)."""
        buf = self._buffers.get(name)
        if buf is None or buf.numel() < rows * cols:
            buf = self._buffers[name] = torch.empty(rows * cols, dtype=torch.float32)
        return buf[:rows * cols].view(rows, cols)


def writes_into(layer: nn.Module, x: torch.Tensor) -> bool:
    """Whether linear_into can compute `layer(x)`: a plain fp32 nn.Linear (not an int8 or bf16
    layer, no active LoRA adapter: those keep their own paths) on a 2-D contiguous input."""
    return (type(layer) is nn.Linear and layer.weight.dtype == torch.float32 and x.dim() == 2
            and x.is_contiguous() and not has_lora(layer))


def linear_into(layer: nn.Linear, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """layer(x) written into out ([rows, out_features]); returns out."""
    if layer.bias is None:
        return torch.mm(x, layer.weight.t(), out=out)
    return torch.addmm(layer.bias, x, layer.weight.t(), out=out)


def act_in_place_by_name(y: torch.Tensor, act_name: str) -> torch.Tensor | None:
    """The activation named in a config applied in y's own memory, or None where it has no
    in-place form here (the caller allocates instead)."""
    name = (act_name or "gelu").lower()
    if name in ("gelu", "gelu_python"):
        return torch.ops.aten.gelu_(y)
    if name in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
        return torch.ops.aten.gelu_(y, approximate="tanh")
    if name in ("silu", "swish"):
        return F.silu(y, inplace=True)
    if name == "relu":
        return y.relu_()
    return None


def apply_activation(y: torch.Tensor, act_name: str, act) -> torch.Tensor:
    """act(y): in y's own memory where the config's activation has an in-place form
    (act_in_place_by_name), else the module `act` into a new block."""
    done = act_in_place_by_name(y, act_name)
    return done if done is not None else act(y)


def linear_act_into(layer: nn.Linear, x: torch.Tensor, out: torch.Tensor, act_name: str,
                    act) -> torch.Tensor:
    """act(layer(x)) with the GEMM written into out ([rows, out_features]) and the activation
    applied there (apply_activation): a long step's plain MLP up projection. A pass of its own
    after the GEMM, since oneDNN's fused epilogue has no output argument."""
    return apply_activation(linear_into(layer, x, out), act_name, act)

