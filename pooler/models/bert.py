"""BERT, RoBERTa and XLM-RoBERTa encoders on packed batches.

RoBERTa-family models differ from BERT only in position ids (offset by padding_idx + 1) and in
having a single token type; both come from the config, so one implementation serves all three.
Heads (pooler dense, classifiers, MLM) live in pooler/pooling, never here.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from pooler.layers.activations import get_activation
from pooler.layers.attention import packed_attention
from pooler.kernels.bert_cpu import bert_layers_on_cpu
from pooler.kernels.build import encoder_kernels
from pooler.kernels.bert_int8_cpu import int8_bert_layers_on_cpu, int8_stack_layers
from pooler.kernels import attention_cpu
from pooler.kernels.attention_cpu import bf16_kernel_takes
from pooler.layers.linear import (linear_act, linear_add_norm, linear_columns, onednn_postop,
                                  takes_bf16)
from pooler.layers.row_attention import attention_for_rows, scatter_rows
from pooler.layers.workspace import Workspace, linear_act_into, linear_into, writes_into
from pooler.layers.lora import lora_active
from pooler.models.inputs import ModelInputs
from pooler.models.weights import copy_renamed_weights


@dataclass
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    pad_token_id: int = 0
    position_offset: int = 0  # RoBERTa: padding_idx + 1

    @classmethod
    def from_dict(cls, d: dict) -> "BertConfig":
        roberta = d.get("model_type") in ("roberta", "xlm-roberta", "camembert")
        pad = int(d.get("pad_token_id", 1 if roberta else 0) or 0)
        if d.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError("Only absolute position embeddings are supported for BERT models, "
                             f"got {d['position_embedding_type']!r}.")
        return cls(
            vocab_size=d["vocab_size"], hidden_size=d["hidden_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=d["num_attention_heads"],
            intermediate_size=d["intermediate_size"],
            max_position_embeddings=d.get("max_position_embeddings", 512),
            type_vocab_size=d.get("type_vocab_size", 2),
            layer_norm_eps=d.get("layer_norm_eps", 1e-12),
            hidden_act=d.get("hidden_act", "gelu"), pad_token_id=pad,
            position_offset=pad + 1 if roberta else 0)


class BertLayer(nn.Module):
    # attention may round fp32 q/k/v to bf16 for its products (pooler/kernels/attention_bf16.c,
    # where the CPU has AVX512_BF16): int8 engines set it (apply_quantization), whose error is
    # far above bf16's; an fp32 engine never does
    attention_bf16_products = False

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.head_dim = cfg.hidden_size // cfg.num_attention_heads
        self.qkv_proj = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)
        self.o_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.attn_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size)
        self.mlp_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.act = get_activation(cfg.hidden_act)
        self.act_name = cfg.hidden_act
        self.act_postop = onednn_postop(cfg.hidden_act)  # GELU fused into the up GEMM on CPU

    def forward(self, x: torch.Tensor, inputs: ModelInputs,
                position_bias: dict[int, torch.Tensor] | None = None,
                workspace: Workspace | None = None) -> torch.Tensor:
        # x: [num_tokens, hidden]; position_bias: length -> [heads, L, L] (MPNet), else None
        # bf16 linears: q/k/v stay bf16 into attention, which computes in fp32 either way (the
        # C kernel widens them, torch's keeps fp32 scores), except with MPNet's fp32 score
        # bias, which torch's kernel does not mix with bf16.
        if workspace is not None and writes_into(self.qkv_proj, x):
            # a long fp32 step: into the buffer the layers share (pooler/layers/workspace.py)
            qkv = linear_into(self.qkv_proj, x, workspace.take("wide", x.shape[0],
                                                               self.qkv_proj.out_features))
        else:
            qkv = linear_act(self.qkv_proj, x, keep_bf16=position_bias is None and (
                not self.attention_bf16_products or bf16_kernel_takes(self.head_dim)))
        qkv = qkv.view(x.shape[0], 3, self.num_heads, self.head_dim)
        attn = packed_attention(qkv[:, 0], qkv[:, 1], qkv[:, 2], inputs.seq_lens,
                                inputs.cu_seqlens, inputs.max_seqlen,
                                num_unattended=inputs.num_unattended,
                                position_bias=position_bias,
                                bf16_products=self.attention_bf16_products)
        x = linear_add_norm(self.o_proj, attn.reshape(x.shape[0], -1), x, self.attn_norm)
        h = self._up(x, workspace)  # [num_tokens, inter]
        return linear_add_norm(self.down_proj, h, x, self.mlp_norm)


    def forward_rows(self, x: torch.Tensor, inputs: ModelInputs, rows: torch.Tensor,
                     keep_bf16: bool | None = None) -> torch.Tensor:
        """This layer's output on `rows` alone ([num_seqs] packed indices, one per sequence,
        in sequence order): keys and values from every token of x [num_tokens, hidden], the
        rest on the rows. Returns [num_seqs, hidden] (the pooled-rows route: run_layers).
        keep_bf16: whether q/k/v leave bf16 and int8 linears rounded to bf16; None: as
        forward's (False after a C stack, whose attention reads them in fp32)."""
        h = x.shape[1]
        keep = keep_bf16 if keep_bf16 is not None else \
            not self.attention_bf16_products or bf16_kernel_takes(self.head_dim)
        kv = linear_columns(self.qkv_proj, x, h, 3 * h, keep)  # [num_tokens, 2 * hidden]
        x_rows = x.index_select(0, rows)  # [num_seqs, hidden]
        q = linear_columns(self.qkv_proj, x_rows, 0, h, keep)  # [num_seqs, hidden]
        k, v = (t.view(x.shape[0], self.num_heads, self.head_dim) for t in kv.split(h, -1))
        attn = attention_for_rows(q.view(-1, self.num_heads, self.head_dim), k, v,
                                  inputs.seq_lens, self.head_dim ** -0.5, inputs.num_unattended)
        y = linear_add_norm(self.o_proj, attn.reshape(x_rows.shape[0], -1), x_rows,
                            self.attn_norm)
        return linear_add_norm(self.down_proj, self._up(y, None), y, self.mlp_norm)

    def _up(self, x: torch.Tensor, workspace: Workspace | None) -> torch.Tensor:
        if workspace is not None and writes_into(self.up_proj, x):
            # a long fp32 step: the GEMM into the shared buffer, then the activation in place
            return linear_act_into(self.up_proj, x, workspace.take(
                "wide", x.shape[0], self.up_proj.out_features), self.act_name, self.act)
        return linear_act(self.up_proj, x, self.act, self.act_postop,
                          keep_bf16=takes_bf16(self.down_proj))


def long_route_takes_one(model: nn.Module, inputs: ModelInputs,
                         position_bias: dict[int, torch.Tensor] | None) -> bool:
    """Whether the torch layers would send one of the step's sequences to the long-attention
    route of attention_cpu (the flash kernel from FLASH_MIN_LEN tokens where
    flash_route_here(), an unattended suffix allowed; else torch's SDPA from SDPA_MIN_LEN
    tokens with every key attended; never with a score bias), where the C stack runs
    attention.h's kernel, 0.5-0.68x slower from 2k tokens. The load-time check that gives the
    C stack large steps times a 512-token step (pooler/worker/layer_stack_check.py): at 8,192
    tokens a 2-layer BGE-M3 (XLM-R large) ran 0.70x sentence-transformers' speed on the C stack
    and 1.01x on the torch layers with the SDPA route (docs/dev/journal.md, "Long documents:
    one workspace per forward")."""
    min_len = long_route_min_len(model)
    if position_bias is not None or min_len is None:
        return False
    if min_len == attention_cpu.FLASH_MIN_LEN and flash_route(model):
        return max(inputs.seq_lens) >= min_len
    unattended = inputs.num_unattended or [0] * len(inputs.seq_lens)
    return any(n >= min_len and not u for n, u in zip(inputs.seq_lens, unattended))


def flash_route(model: nn.Module) -> bool:
    lib = encoder_kernels()
    cfg = model.config
    return lib is not None and attention_cpu.flash_route_here(
        lib.variant, cfg.hidden_size // cfg.num_attention_heads)


def long_route_min_len(model: nn.Module) -> int | None:
    """The document length from which the torch layers' attention takes the long route (the
    flash kernel or SDPA), or None where the attention kernels are off or not built."""
    if not attention_cpu.ENABLED or encoder_kernels() is None:
        return None
    return attention_cpu.FLASH_MIN_LEN if flash_route(model) else attention_cpu.SDPA_MIN_LEN


# Steps of at most this many tokens that a C layer stack takes run the whole stack in C even
# when the pooling reads one row per sequence: the last layer in torch on the rows costs ~15
# eager ops and five oneDNN calls (~66 us each on a few rows), more than the C stack's last
# layer on so few tokens. Off/on time, fp32 C stack either way, Xeon (Sapphire Rapids) VM, 2
# threads, best of 5 alternating (benchmarks/prune_last_layer.py --parts short): MiniLM-L6
# 0.69 at 12 tokens, 0.89 at 48, 0.97 at 96, 1.02 at 192, 1.08 at 256; BERT-base 0.90 at 12,
# 0.98 at 48, 1.03 at 96, 1.04 at 192. The int8 stack's steps (at most 64 tokens) stay whole.
C_STACK_PRUNE_MIN_TOKENS = 128


def pruned_rows(model: nn.Module, inputs: ModelInputs,
                position_bias: dict[int, torch.Tensor] | None = None) -> torch.Tensor | None:
    """The rows whose last-layer output the step's pooling reads ([num_seqs] packed indices,
    ModelInputs.output_rows), where `model` takes the pooled-rows route
    (ModelInputs.last_layer_rows) and has no score bias (MPNet's relative positions); None
    means every row."""
    return None if position_bias is not None else inputs.last_layer_rows(model)


def run_layers(model: nn.Module, x: torch.Tensor, inputs: ModelInputs,
               position_bias: dict[int, torch.Tensor] | None = None) -> torch.Tensor:
    """model.layers (BertLayers) over x [num_tokens, hidden]: a short step in one C call
    (pooler/kernels/bert_int8_cpu.py for int8 layers that kept no fp32 copy, or the int8 layers
    an fp32 model keeps for short steps; else bert_cpu.py in fp32), anything else layer by
    layer. BERT, DistilBERT and MPNet. A step with LoRA adapters goes layer by layer: the C
    stacks cannot add their updates; so does a step with a long document (long_route_takes_one).
    With `inputs.output_rows` (pruned_rows), the last layer runs on those rows alone
    (BertLayer.forward_rows), after the others in C or in torch; only those rows of the result
    hold the last layer's output."""
    rows = pruned_rows(model, inputs, position_bias)
    if rows is not None:
        return _run_layers_then_rows(model, x, inputs, rows)
    if not lora_active() and not long_route_takes_one(model, inputs, position_bias):
        fused = int8_bert_layers_on_cpu(model, x, inputs, position_bias)
        if fused is None:
            fused = bert_layers_on_cpu(model, x, inputs, position_bias)
        if fused is not None:
            return fused
    return _torch_layers(model, model.layers, x, inputs, position_bias)


def _torch_layers(model: nn.Module, layers, x: torch.Tensor, inputs: ModelInputs,
                  position_bias: dict[int, torch.Tensor] | None = None) -> torch.Tensor:
    # long fp32 steps: the widest activations in buffers the layers share for this pass
    # (q/k/v and the up projection share its "wide" buffer)
    # (from the config: calibration may have wrapped the linear layers)
    cfg = model.config
    workspace = Workspace.for_step(x, max(3 * cfg.hidden_size, cfg.intermediate_size))
    for layer in layers:
        x = layer(x, inputs, position_bias, workspace)
    return x


def _run_layers_then_rows(model: nn.Module, x: torch.Tensor, inputs: ModelInputs,
                          rows: torch.Tensor) -> torch.Tensor:
    """All layers but the last as run_layers would run them (the C stacks take a layer count:
    the same call one layer short), then the last on `rows`, written into x's rows. A step of
    at most C_STACK_PRUNE_MIN_TOKENS tokens that a C stack takes runs the whole stack in C."""
    num_layers = len(model.layers)
    if not long_route_takes_one(model, inputs, None):
        if x.shape[0] <= C_STACK_PRUNE_MIN_TOKENS:
            if int8_bert_layers_on_cpu(model, x, inputs) is not None or \
                    bert_layers_on_cpu(model, x, inputs) is not None:
                return x
        else:
            stack = int8_bert_layers_on_cpu(model, x, inputs, num_layers=num_layers - 1)
            # the int8 stack's own last layer (an fp32 model's int8 twin for short steps)
            last = int8_stack_layers(model)[-1] if stack is not None else model.layers[-1]
            if stack is None:
                stack = bert_layers_on_cpu(model, x, inputs, num_layers=num_layers - 1)
            if stack is not None:
                return scatter_rows(stack, rows,
                                    last.forward_rows(stack, inputs, rows, keep_bf16=False))
    x = _torch_layers(model, model.layers[:-1], x, inputs)
    return scatter_rows(x, rows, model.layers[-1].forward_rows(x, inputs, rows))


# HF parameter name (after the model prefix) -> (our name, slot in a fused q/k/v weight).
_RENAMES = [
    (r"^embeddings\.LayerNorm\.(weight|bias)$", r"embed_norm.\1", None),
    (r"^embeddings\.(word|position|token_type)_embeddings\.weight$", r"\1_embeddings.weight", None),
    (r"^encoder\.layer\.(\d+)\.attention\.self\.query\.(weight|bias)$", r"layers.\1.qkv_proj.\2", 0),
    (r"^encoder\.layer\.(\d+)\.attention\.self\.key\.(weight|bias)$", r"layers.\1.qkv_proj.\2", 1),
    (r"^encoder\.layer\.(\d+)\.attention\.self\.value\.(weight|bias)$", r"layers.\1.qkv_proj.\2", 2),
    (r"^encoder\.layer\.(\d+)\.attention\.output\.dense\.(weight|bias)$", r"layers.\1.o_proj.\2", None),
    (r"^encoder\.layer\.(\d+)\.attention\.output\.LayerNorm\.(weight|bias)$", r"layers.\1.attn_norm.\2", None),
    (r"^encoder\.layer\.(\d+)\.intermediate\.dense\.(weight|bias)$", r"layers.\1.up_proj.\2", None),
    (r"^encoder\.layer\.(\d+)\.output\.dense\.(weight|bias)$", r"layers.\1.down_proj.\2", None),
    (r"^encoder\.layer\.(\d+)\.output\.LayerNorm\.(weight|bias)$", r"layers.\1.mlp_norm.\2", None),
]
_RENAMES = [(re.compile(p), r, s) for p, r, s in _RENAMES]


class BertModel(nn.Module):
    # load_weights reads the checkpoint once, in order: the loader streams it (pooler/loader.py)
    loads_weights_in_one_pass = True
    # its short steps run the C layer stack (run_layers): int8 keeps fp32 copies for it
    short_steps_in_c = True
    # a step whose pooling reads one row per sequence runs the last layer on those rows alone
    # (ModelInputs.output_rows, run_layers)
    prunes_last_layer = True

    # Checkpoint prefixes of the task models (BertForX keeps the encoder under `bert.`).
    weight_prefixes = ("bert.", "roberta.", "model.")
    # Checkpoint name -> our name (LoRA adapters name the checkpoint's layers: pooler/lora).
    weight_renames = _RENAMES

    config_class = BertConfig  # ELECTRA's adds an embedding size

    def __init__(self, hf_config: dict):
        super().__init__()
        cfg = self.config = self.config_class.from_dict(hf_config)
        dim = getattr(cfg, "embedding_size", cfg.hidden_size)
        self.word_embeddings = nn.Embedding(cfg.vocab_size, dim)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, dim)
        self.token_type_embeddings = nn.Embedding(max(cfg.type_vocab_size, 1), dim)
        self.embed_norm = nn.LayerNorm(dim, eps=cfg.layer_norm_eps)
        self.layers = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.num_hidden_layers))

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    def get_input_embeddings(self) -> nn.Embedding:
        return self.word_embeddings

    def embed(self, inputs: ModelInputs) -> torch.Tensor:  # [num_tokens, embedding dim]
        offset = self.config.position_offset
        if len(inputs.seq_lens) == 1:  # one sequence: its positions are offset..offset+L-1
            x = self.word_embeddings(inputs.input_ids) + \
                self.position_embeddings.weight[offset:offset + inputs.seq_lens[0]]
        else:
            positions = inputs.positions + offset if offset else inputs.positions
            x = self.word_embeddings(inputs.input_ids) + self.position_embeddings(positions)
        if inputs.token_type_ids is not None:
            x = x + self.token_type_embeddings(inputs.token_type_ids)
        else:
            x = x + self.token_type_embeddings.weight[0]
        return self.embed_norm(x)

    def forward(self, inputs: ModelInputs) -> torch.Tensor:  # [num_tokens, hidden]
        x = self.embed(inputs)
        return run_layers(self, x, inputs)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy matching checkpoint tensors in; returns the checkpoint names consumed."""
        return copy_renamed_weights(self, weights, _RENAMES, "BERT backbone")
