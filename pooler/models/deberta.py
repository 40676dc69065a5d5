"""DeBERTa (v1) and DeBERTa-v2/v3 encoders on packed batches.

Disentangled attention: besides content-to-content scores q.k, each pair of tokens (i, j) gets
content-to-position (c2p: q_i . Pk[r(i, j)]) and position-to-content (p2c: k_j . Pq[r(j, i)])
terms, where Pk/Pq project a table of relative-position embeddings and r is the relative
distance i - j (log-bucketed in v3 with `position_buckets`), clamped to the table. Relative
distances only exist inside a sequence, so the bias is built per run of equal-length sequences
(pooler/layers/biased_attention.py), never on a padded batch.

v1 differs only in parameter layout (one fused bias-free `in_proj` laid out head by head, with
separate `q_bias`/`v_bias`; bias-free `pos_proj`), no buckets, no shared keys, no
relative-embedding norm; its relative index clamp(i - j + max_relative_positions) is the v2 one
without buckets, so both run through the same code after loading.
A step whose pooling reads one row per sequence ([CLS] through ContextPooler) runs the last
layer on those rows alone (ModelInputs.output_rows): their content-to-content and c2p scores,
and p2c against every key, read the same table rows as the full layer
(DisentangledAttention.attend_rows).
Heads (ContextPooler + classifier, token classifier) live in pooler/pooling, never here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from pooler.layers.activations import get_activation
from pooler.layers.attention import packed_attention
from pooler.layers.biased_attention import packed_biased_attention
from pooler.layers.linear import linear_act, linear_columns, onednn_postop
from pooler.layers.row_attention import attention_for_rows, scatter_rows, sequence_ids
from pooler.models.inputs import ModelInputs


@dataclass
class DebertaConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    head_dim: int
    intermediate_size: int
    embedding_size: int
    max_position_embeddings: int = 512
    type_vocab_size: int = 0
    layer_norm_eps: float = 1e-7
    hidden_act: str = "gelu"
    position_biased_input: bool = True
    relative_attention: bool = False
    pos_att_type: tuple[str, ...] = ()
    share_att_key: bool = False
    position_buckets: int = -1
    max_relative_positions: int = -1  # resolved: max_position_embeddings when < 1
    norm_rel_embeddings: bool = False  # norm_rel_ebd contains "layer_norm"
    conv_kernel_size: int = 0
    conv_groups: int = 1
    conv_act: str = "tanh"
    v1: bool = False

    @property
    def att_span(self) -> int:
        """Half the rows of the relative-embedding table the attention reads."""
        return self.position_buckets if self.position_buckets > 0 else self.max_relative_positions

    @property
    def scale(self) -> float:
        """1 / sqrt(head_dim * (1 + number of position terms)), as both versions scale."""
        return 1.0 / math.sqrt(self.head_dim * (1 + len(self.pos_att_type)))

    @classmethod
    def from_dict(cls, d: dict) -> "DebertaConfig":
        v1 = d.get("model_type") == "deberta"
        if v1 and d.get("talking_head"):
            raise ValueError("DeBERTa talking_head attention is not implemented natively; "
                             "run this model with runner='transformers'.")
        pos_att_type = d.get("pos_att_type") or []
        if isinstance(pos_att_type, str):
            pos_att_type = [x.strip() for x in pos_att_type.lower().split("|")]
        unknown = set(pos_att_type) - {"c2p", "p2c", "", "none"}
        if unknown:
            raise ValueError(f"pos_att_type may contain 'c2p' and 'p2c', got {sorted(unknown)}.")
        hidden, heads = d["hidden_size"], d["num_attention_heads"]
        if hidden % heads:
            raise ValueError(f"hidden_size ({hidden}) must be a multiple of "
                             f"num_attention_heads ({heads}).")
        max_positions = int(d.get("max_position_embeddings", 512))
        max_relative = int(d.get("max_relative_positions", -1))
        norm_rel = [x.strip() for x in str(d.get("norm_rel_ebd", "none")).lower().split("|")]
        return cls(
            vocab_size=d["vocab_size"], hidden_size=hidden,
            num_hidden_layers=d["num_hidden_layers"], num_attention_heads=heads,
            # v2 may set attention_head_size (inner size heads * head_dim != hidden)
            head_dim=hidden // heads if v1 else int(d.get("attention_head_size") or
                                                   hidden // heads),
            intermediate_size=d["intermediate_size"],
            embedding_size=int(d.get("embedding_size") or hidden),
            max_position_embeddings=max_positions,
            type_vocab_size=int(d.get("type_vocab_size", 0)),
            layer_norm_eps=float(d.get("layer_norm_eps", 1e-7)),
            hidden_act=d.get("hidden_act", "gelu"),
            position_biased_input=bool(d.get("position_biased_input", True)),
            relative_attention=bool(d.get("relative_attention", False)),
            pos_att_type=tuple(t for t in ("c2p", "p2c") if t in pos_att_type),
            share_att_key=bool(d.get("share_att_key", False)) and not v1,
            position_buckets=-1 if v1 else int(d.get("position_buckets", -1)),
            max_relative_positions=max_relative if max_relative >= 1 else max_positions,
            norm_rel_embeddings="layer_norm" in norm_rel and not v1,
            conv_kernel_size=0 if v1 else int(d.get("conv_kernel_size", 0)),
            conv_groups=int(d.get("conv_groups", 1)), conv_act=d.get("conv_act", "tanh"),
            v1=v1)


# ---- relative positions ------------------------------------------------------------------------
def log_bucket_positions(relative: torch.Tensor, buckets: int, max_position: int) -> torch.Tensor:
    """DeBERTa-v3's log buckets: distances under buckets // 2 stay exact, longer ones share
    logarithmically wider buckets up to max_position. Computed in fp32 as the reference does,
    so the bucket edges agree exactly. relative: int64 -> int64, same shape."""
    mid = buckets // 2
    sign = torch.sign(relative)
    abs_pos = torch.where((relative < mid) & (relative > -mid),
                          torch.tensor(mid - 1, dtype=relative.dtype), relative.abs())
    log_pos = torch.ceil(torch.log(abs_pos / mid)
                         / torch.log(torch.tensor((max_position - 1) / mid)) * (mid - 1)) + mid
    return torch.where(abs_pos <= mid, relative.to(log_pos.dtype), log_pos * sign).long()


@lru_cache(maxsize=256)
def _relative_rows(length: int, span: int, buckets: int,
                   max_position: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of the relative-embedding table each pair reads, as the reference indexes them:
    c2p[i, j] for query i and key j, and p2c[j, i] for key j and query i (both [L, L] int64,
    CPU), each clamp(+-(i - j) + span, 0, 2 * span - 1) with i - j bucketed when buckets > 0."""
    ids = torch.arange(length)
    relative = ids[:, None] - ids[None, :]  # [L, L]: i - j
    if buckets > 0 and max_position > 0:
        relative = log_bucket_positions(relative, buckets, max_position)
    c2p = torch.clamp(relative + span, 0, 2 * span - 1)
    p2c = torch.clamp(-relative + span, 0, 2 * span - 1)
    return c2p, p2c


@lru_cache(maxsize=256)
def _shifted_rows(length: int, lo: int, span: int, buckets: int, max_position: int,
                  device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """_relative_rows minus `lo`, on `device`, both indexed [query i, key j]: c2p's row for
    (i, j), and p2c's row for key j seen from query i. Cached per device: a GPU step does not
    copy its index tables again."""
    c2p, p2c = _relative_rows(length, span, buckets, max_position)
    return (c2p - lo).to(device), (p2c.T - lo).contiguous().to(device)


class _RelativeIndex:
    """The table rows each sequence length of one forward reads, shifted to a slice of the
    table: only rows [lo, hi] can be read by sequences up to the batch's longest."""

    def __init__(self, cfg: DebertaConfig, max_len: int, device: torch.device):
        self.key = (cfg.att_span, cfg.position_buckets, cfg.max_relative_positions)
        self.device = device
        c2p, _ = _relative_rows(max_len, *self.key)
        self.lo, self.hi = int(c2p.min()), int(c2p.max())  # the longest reads the widest range

    def __call__(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """[L, L] c2p and p2c rows relative to `lo` (see _shifted_rows)."""
        return _shifted_rows(length, self.lo, *self.key, self.device)


# ---- layers ------------------------------------------------------------------------------------
class DebertaEmbeddings(nn.Module):
    def __init__(self, cfg: DebertaConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.embedding_size)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.embedding_size) \
            if cfg.position_biased_input else None
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.embedding_size) \
            if cfg.type_vocab_size > 0 else None
        self.embed_proj = nn.Linear(cfg.embedding_size, cfg.hidden_size, bias=False) \
            if cfg.embedding_size != cfg.hidden_size else None
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, inputs: ModelInputs) -> torch.Tensor:  # [num_tokens, hidden]
        x = self.word_embeddings(inputs.input_ids)
        if self.position_embeddings is not None:
            x = x + self.position_embeddings(inputs.positions)
        if self.token_type_embeddings is not None:
            if inputs.token_type_ids is not None:
                x = x + self.token_type_embeddings(inputs.token_type_ids)
            else:
                x = x + self.token_type_embeddings.weight[0]
        if self.embed_proj is not None:
            x = self.embed_proj(x)
        return self.LayerNorm(x)


class DisentangledAttention(nn.Module):
    def __init__(self, cfg: DebertaConfig):
        super().__init__()
        self.cfg = cfg
        self.num_heads, self.head_dim = cfg.num_attention_heads, cfg.head_dim
        inner = self.num_heads * self.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, 3 * inner)  # query_proj | key_proj | value_proj
        self.pos_key_proj = nn.Linear(cfg.hidden_size, inner) \
            if cfg.relative_attention and not cfg.share_att_key and "c2p" in cfg.pos_att_type \
            else None
        self.pos_query_proj = nn.Linear(cfg.hidden_size, inner) \
            if cfg.relative_attention and not cfg.share_att_key and "p2c" in cfg.pos_att_type \
            else None

    def _project_positions(self, rel: torch.Tensor) -> tuple[torch.Tensor | None,
                                                              torch.Tensor | None]:
        """rel: [W, hidden] table rows -> position keys [heads, head_dim, W] and position
        queries [heads, W, head_dim], pre-multiplied by the attention scale (the reference
        divides each position term by the same factor), or None for a term the model lacks."""
        inner = self.num_heads * self.head_dim
        w, b = self.qkv_proj.weight, self.qkv_proj.bias
        shape = (rel.shape[0], self.num_heads, self.head_dim)
        keys = queries = None
        if "c2p" in self.cfg.pos_att_type:
            keys = F.linear(rel, w[inner:2 * inner], b[inner:2 * inner]) \
                if self.pos_key_proj is None else self.pos_key_proj(rel)
            keys = (keys * self.cfg.scale).view(shape).permute(1, 2, 0)
        if "p2c" in self.cfg.pos_att_type:
            queries = F.linear(rel, w[:inner], b[:inner]) \
                if self.pos_query_proj is None else self.pos_query_proj(rel)
            queries = (queries * self.cfg.scale).view(shape).transpose(0, 1)
        return keys, queries

    def forward(self, x: torch.Tensor, inputs: ModelInputs, rel: torch.Tensor | None,
                index: _RelativeIndex | None) -> torch.Tensor:
        # x: [num_tokens, hidden] -> qkv: [num_tokens, 3, heads, head_dim]
        qkv = linear_act(self.qkv_proj, x).view(x.shape[0], 3, self.num_heads, self.head_dim)
        scale = self.cfg.scale
        if rel is None:  # no relative attention: plain scaled dot product
            attn = packed_attention(qkv[:, 0], qkv[:, 1], qkv[:, 2], inputs.seq_lens,
                                    inputs.cu_seqlens, inputs.max_seqlen, scale=scale,
                                    num_unattended=inputs.num_unattended)
            return attn.reshape(x.shape[0], -1)
        pos_keys, pos_queries = self._project_positions(rel)

        def bias_fn(qs: torch.Tensor, ks: torch.Tensor) -> torch.Tensor:
            # qs, ks: [n, heads, L, head_dim] -> [n, heads, L(queries), L(keys)], scaled
            n, heads, length, _ = qs.shape
            c2p_rows, p2c_rows = index(length)  # [L, L] each, [query, key]
            shape = (n, heads, length, length)
            bias = None
            if pos_keys is not None:  # content -> position: q_i . Pk[r(i, j)]
                c2p = torch.matmul(qs, pos_keys)  # [n, heads, L, W]
                bias = torch.gather(c2p, -1, c2p_rows.expand(shape))
            if pos_queries is not None:  # position -> content: k_j . Pq[r(j, i)]
                p2c = torch.matmul(pos_queries, ks.transpose(-1, -2))  # [n, heads, W, L(keys)]
                p2c = torch.gather(p2c, -2, p2c_rows.expand(shape))
                bias = p2c if bias is None else bias.add_(p2c)
            return bias

        attn = packed_biased_attention(qkv[:, 0], qkv[:, 1], qkv[:, 2], inputs.seq_lens,
                                       bias_fn, scale, inputs.num_unattended,
                                       widest_bias=2 * rel.shape[0])
        return attn.reshape(x.shape[0], -1)  # [num_tokens, heads * head_dim]

    def attend_rows(self, x: torch.Tensor, inputs: ModelInputs, rel: torch.Tensor | None,
                    index: _RelativeIndex | None, rows: torch.Tensor,
                    positions: list[int]) -> torch.Tensor:  # [num_seqs, heads * head_dim]
        """Attention of `rows` alone ([num_seqs] packed indices, one per sequence, at
        `positions` in it) against every token's keys and values (the pooled-rows route:
        DebertaModel.forward). Each key j of a row at position p gets the full layer's terms:
        c2p q_p . Pk[c2p(p, j)] and p2c k_j . Pq[p2c(p, j)], the table rows read from the very
        [L, L] index tables the full layers use (row p of each)."""
        n, s, inner = x.shape[0], rows.shape[0], self.num_heads * self.head_dim
        kv = linear_columns(self.qkv_proj, x, inner, 3 * inner)  # [num_tokens, 2 * inner]
        kv = kv.view(n, 2, self.num_heads, self.head_dim)
        k, v = kv[:, 0], kv[:, 1]  # [num_tokens, heads, head_dim]
        q = linear_columns(self.qkv_proj, x.index_select(0, rows), 0, inner)
        q = q.view(s, self.num_heads, self.head_dim)
        bias = None
        if rel is not None:
            pos_keys, pos_queries = self._project_positions(rel)
            # [num_tokens] the table row (from index.lo) each key reads for its sequence's query
            c2p_rows, p2c_rows = [], []
            for length, p in zip(inputs.seq_lens, positions):
                c2p_table, p2c_table = index(length)  # [L, L] each, [query, key]: cached
                c2p_rows.append(c2p_table[p])
                p2c_rows.append(p2c_table[p])
            c2p_at, p2c_at = torch.cat(c2p_rows), torch.cat(p2c_rows)
            if pos_keys is not None:  # content -> position: q_p . Pk[c2p(p, j)]
                c2p = torch.einsum("shd,hdw->swh", q.to(pos_keys.dtype), pos_keys)  # [S, W, heads]
                seq = sequence_ids(inputs.seq_lens, x.device)  # [num_tokens]
                bias = c2p[seq, c2p_at]  # [num_tokens, heads]
            if pos_queries is not None:  # position -> content: k_j . Pq[p2c(p, j)]
                picked = pos_queries.index_select(1, p2c_at)  # [heads, num_tokens, head_dim]
                p2c = torch.einsum("htd,thd->th", picked, k.to(picked.dtype))
                bias = p2c if bias is None else bias.add_(p2c)
        out = attention_for_rows(q, k, v, inputs.seq_lens, self.cfg.scale,
                                 inputs.num_unattended, bias=bias)
        return out.reshape(s, -1)


class DebertaLayer(nn.Module):
    def __init__(self, cfg: DebertaConfig):
        super().__init__()
        inner = cfg.num_attention_heads * cfg.head_dim
        self.attention = DisentangledAttention(cfg)
        self.attn_out = nn.Linear(inner, cfg.hidden_size)
        self.attn_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size)
        self.mlp_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.act = get_activation(cfg.hidden_act)
        self.act_postop = onednn_postop(cfg.hidden_act)

    def forward(self, x: torch.Tensor, inputs: ModelInputs, rel: torch.Tensor | None,
                index: _RelativeIndex | None) -> torch.Tensor:  # [num_tokens, hidden]
        attn = self.attention(x, inputs, rel, index)
        x = self.attn_norm(x + linear_act(self.attn_out, attn))
        h = linear_act(self.up_proj, x, self.act, self.act_postop,
                       keep_bf16=True)  # [num_tokens, inter]
        return self.mlp_norm(x + linear_act(self.down_proj, h))

    def forward_rows(self, x: torch.Tensor, inputs: ModelInputs, rel: torch.Tensor | None,
                     index: _RelativeIndex | None, rows: torch.Tensor,
                     positions: list[int]) -> torch.Tensor:  # [num_seqs, hidden]
        """This layer's output on `rows` alone (keys and values still from every token)."""
        attn = self.attention.attend_rows(x, inputs, rel, index, rows, positions)
        x = self.attn_norm(x.index_select(0, rows) + linear_act(self.attn_out, attn))
        h = linear_act(self.up_proj, x, self.act, self.act_postop, keep_bf16=True)
        return self.mlp_norm(x + linear_act(self.down_proj, h))


class DebertaConv(nn.Module):
    """The 1-D convolution some DeBERTa-v2 checkpoints add after layer 0 (conv_kernel_size),
    run per sequence with zero padding at its edges (as the reference sees a padded batch,
    whose padding embeddings it zeroes)."""

    def __init__(self, cfg: DebertaConfig):
        super().__init__()
        k = cfg.conv_kernel_size
        if k % 2 == 0:
            raise ValueError(f"conv_kernel_size must be odd, got {k}.")
        self.conv = nn.Conv1d(cfg.hidden_size, cfg.hidden_size, k, padding=(k - 1) // 2,
                              groups=cfg.conv_groups)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.act = get_activation(cfg.conv_act)

    def forward(self, embedded: torch.Tensor, layer_out: torch.Tensor,
                seq_lens: list[int]) -> torch.Tensor:  # [num_tokens, hidden]
        out = torch.empty_like(embedded)
        start, i = 0, 0
        while i < len(seq_lens):  # sequences of one length convolve as one batch
            length = seq_lens[i]
            j = i + 1
            while j < len(seq_lens) and seq_lens[j] == length:
                j += 1
            end = start + (j - i) * length
            x = embedded[start:end].view(j - i, length, -1).transpose(1, 2)  # [n, hidden, L]
            out[start:end] = self.conv(x).transpose(1, 2).reshape(end - start, -1)
            start, i = end, j
        return self.LayerNorm(layer_out + self.act(out))


class DebertaModel(nn.Module):
    """Backbone of DebertaModel / DebertaV2Model and their task models (`deberta.` prefix)."""
    weight_prefixes = ("deberta.",)
    # int8: _project_positions multiplies the relative-position table by qkv_proj's weight
    int8_keep_fp32 = ("qkv_proj",)
    # a step whose pooling reads one row per sequence runs the last layer on those rows alone
    # (ModelInputs.output_rows)
    prunes_last_layer = True

    def __init__(self, hf_config: dict):
        super().__init__()
        cfg = self.config = DebertaConfig.from_dict(hf_config)
        self.embeddings = DebertaEmbeddings(cfg)
        self.layers = nn.ModuleList(DebertaLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.rel_embeddings = nn.Embedding(2 * cfg.att_span, cfg.hidden_size) \
            if cfg.relative_attention else None
        self.rel_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps) \
            if cfg.relative_attention and cfg.norm_rel_embeddings else None
        self.conv = DebertaConv(cfg) if cfg.conv_kernel_size > 0 else None

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.word_embeddings

    def forward(self, inputs: ModelInputs) -> torch.Tensor:  # [num_tokens, hidden]
        x = self.embeddings(inputs)
        rel = index = None
        if self.rel_embeddings is not None and self.config.pos_att_type:
            index = _RelativeIndex(self.config, inputs.max_seqlen, x.device)
            rel = self.rel_embeddings.weight[index.lo:index.hi + 1]  # [W, hidden]
            if self.rel_norm is not None:
                rel = self.rel_norm(rel)
        embedded = x
        # the layer-0 convolution reads every token of layer 0's output: not a last layer to prune
        rows = inputs.last_layer_rows(self, min_layers=2 if self.conv is not None else 1)
        last = len(self.layers) if rows is None else len(self.layers) - 1
        for i, layer in enumerate(self.layers[:last]):
            x = layer(x, inputs, rel, index)
            if i == 0 and self.conv is not None:
                x = self.conv(embedded, x, inputs.seq_lens)
        if rows is None:
            return x
        out = self.layers[-1].forward_rows(x, inputs, rel, index, rows,
                                           inputs.output_row_positions())
        # only the pooled rows hold the model's output: the pooling reads no other
        return scatter_rows(x, rows, out)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Map the checkpoint's names (prefix stripped) onto ours; returns those consumed."""
        from pooler.models.deberta_weights import load_deberta_weights

        return load_deberta_weights(self, weights)
