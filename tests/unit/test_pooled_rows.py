"""The pooled-rows route's parts: attention of one query row per sequence against full attention
(GQA, unattended keys, an additive per-key bias), which rows the poolers say they read (and when
they refuse), and the BERT layer stack's routes with the last layer on the rows (the C stacks
one layer short, fp32 large steps, int8, a long document on the torch layers) against the full
stack, on both kernel builds."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pooler.kernels import bert_cpu, bert_int8_cpu
from pooler.kernels.build import encoder_kernels
from pooler.kernels.int8_cpu import runnable_paths
from pooler.layers.quantization import quantize_linears, record_input_ranges
from pooler.layers.row_attention import attention_for_rows
from pooler.models import bert
from pooler.models.bert import BertModel
from pooler.params import PoolingParams
from pooler.pooling.classify import ScoreHead, SequenceClassifyPooler
from pooler.pooling.dispatch import DispatchPooler
from pooler.pooling.heads import DenseProjector
from pooler.pooling.metadata import PoolingMetadata
from pooler.pooling.poolers import EmbeddingPooler, TokenEmbeddingPooler
from tests.unit.bert_stack import packed_inputs, tiny_bert


def _reference_rows(q_full, k, v, lengths, rows, unattended, causal=False, half_window=None):
    """Full attention per sequence (SDPA, GQA by repeating kv heads), read at `rows`."""
    out, start = [], 0
    group = q_full.shape[1] // k.shape[1]
    for i, n in enumerate(lengths):
        qs, ks, vs = (t[start:start + n].transpose(0, 1) for t in (q_full, k, v))
        ks, vs = ks.repeat_interleave(group, 0), vs.repeat_interleave(group, 0)
        query, key = torch.arange(n)[:, None], torch.arange(n)[None, :]
        mask = (key < n - unattended[i]).expand(n, n)
        if causal:
            mask = mask & (key <= query)
        if half_window is not None:
            mask = mask & ((query - key).abs() <= half_window)
        o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask[None])
        out.append(o.transpose(0, 1)[rows[i] - start])
        start += n
    return torch.stack(out)


@pytest.mark.parametrize("copies", [1, 3])
@pytest.mark.parametrize("heads,kv_heads,unattended", [(4, 4, None), (4, 2, None),
                                                       (6, 2, [0, 2, 0, 3])])
def test_attention_for_rows_equals_full_attention_at_the_rows(heads, kv_heads, unattended,
                                                              copies):
    torch.manual_seed(0)
    lengths, d = [1, 7, 30, 12] * copies, 16
    unattended = None if unattended is None else unattended * copies
    total = sum(lengths)
    q_full = torch.randn(total, heads, d)
    k, v = torch.randn(total, kv_heads, d), torch.randn(total, kv_heads, d)
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    rows = [s + (i * 5) % n for i, (s, n) in enumerate(zip(starts, lengths))]  # any row
    out = attention_for_rows(q_full[rows], k, v, lengths, d ** -0.5, unattended)
    expected = _reference_rows(q_full, k, v, lengths, rows, unattended or [0] * len(lengths))
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("lengths", [[40], [1, 7, 30, 12, 9]])
@pytest.mark.parametrize("causal,half_window", [(True, None), (True, 4), (False, 3)])
def test_causal_and_windowed_rows(lengths, causal, half_window):
    torch.manual_seed(2)
    total = sum(lengths)
    q_full = torch.randn(total, 4, 16)
    k, v = torch.randn(total, 2, 16), torch.randn(total, 2, 16)
    positions = [(i * 7) % n for i, n in enumerate(lengths)]  # not only the last token
    rows = [sum(lengths[:i]) + p for i, p in enumerate(positions)]
    out = attention_for_rows(q_full[rows], k, v, lengths, 0.25, query_positions=positions,
                             causal=causal, half_window=half_window)
    expected = _reference_rows(q_full, k, v, lengths, rows, [0] * len(lengths), causal,
                               half_window)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="query_positions"):
        attention_for_rows(q_full[rows], k, v, lengths, 0.25, causal=True)


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2)])
def test_one_document_alone(heads, kv_heads):
    torch.manual_seed(1)
    q_full = torch.randn(50, heads, 16)
    k, v = torch.randn(50, kv_heads, 16), torch.randn(50, kv_heads, 16)
    out = attention_for_rows(q_full[[49]], k, v, [50], 0.25, [3])
    torch.testing.assert_close(out, _reference_rows(q_full, k, v, [50], [49], [3]),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("lengths,unattended", [([40], [3]), ([1, 7, 30, 12], [0, 2, 0, 3])])
def test_an_additive_per_key_bias(lengths, unattended):
    """DeBERTa's relative-position terms: bias [num_tokens, heads] added to each row's scaled
    scores, on the segment ops and on a document alone (GQA, unattended keys)."""
    torch.manual_seed(3)
    total, heads, kv_heads, d = sum(lengths), 4, 2, 16
    q_full = torch.randn(total, heads, d)
    k, v = torch.randn(total, kv_heads, d), torch.randn(total, kv_heads, d)
    bias = 2 * torch.randn(total, heads)
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    rows = [s + (i * 5) % n for i, (s, n) in enumerate(zip(starts, lengths))]
    out = attention_for_rows(q_full[rows], k, v, lengths, 0.25, unattended, bias=bias)
    expected = []
    for i, (start, n) in enumerate(zip(starts, lengths)):
        qs = q_full[rows[i]][:, None, :]  # [heads, 1, d]
        ks, vs = (t[start:start + n].transpose(0, 1).repeat_interleave(heads // kv_heads, 0)
                  for t in (k, v))  # [heads, n, d]
        mask = bias[start:start + n].T[:, None, :].clone()  # [heads, 1, n]
        mask[..., n - unattended[i]:] = float("-inf")
        expected.append(F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask,
                                                       scale=0.25)[:, 0])
    torch.testing.assert_close(out, torch.stack(expected), rtol=1e-5, atol=1e-6)
    without = attention_for_rows(q_full[rows], k, v, lengths, 0.25, unattended)
    assert (out - without).abs().max() > 1e-2  # the bias mattered


def test_attention_for_rows_refuses_a_row_count_that_is_not_one_per_sequence():
    q, k = torch.randn(2, 2, 16), torch.randn(10, 2, 16)
    with pytest.raises(ValueError, match="one query row per sequence"):
        attention_for_rows(q, k, k, [4, 3, 3], 0.25)


def _metadata(tasks: list[str], lengths: list[int]) -> PoolingMetadata:
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    return PoolingMetadata(req_ids=[str(i) for i in range(len(tasks))], seq_lens=lengths,
                           seq_starts=starts, num_prompt_tokens=[0] * len(tasks),
                           pooling_params=[PoolingParams(task=t) for t in tasks],
                           special_tokens_masks=[None] * len(tasks),
                           input_ids=torch.arange(sum(lengths)))


def _dispatch(mode: str = "cls") -> DispatchPooler:
    return DispatchPooler({
        "embed": EmbeddingPooler(mode, True, DenseProjector([]), 8),
        "token_embed": TokenEmbeddingPooler(8),
        "classify": SequenceClassifyPooler(ScoreHead(8, 2), "last_non_pad", "sigmoid",
                                           pad_token_id=7)})


def test_rows_read_one_row_per_request_across_tasks():
    lengths = [3, 5, 4]
    rows = _dispatch().rows_read(_metadata(["embed", "classify", "embed"], lengths))
    # embed: [CLS] of texts 0 and 2; classify: the last non-pad token of text 1 (token 7, at
    # packed row 7, is the pad id: transformers' choice is the one before it)
    assert rows == [0, 6, 8]
    assert _dispatch("lasttoken").rows_read(_metadata(["embed"] * 3, lengths)) == [2, 7, 11]


@pytest.mark.parametrize("mode,tasks", [("mean", ["embed", "embed"]),
                                        ("max", ["embed", "classify"]),
                                        ("cls", ["embed", "token_embed"])])
def test_rows_read_refuses_when_any_request_reads_more(mode, tasks):
    assert _dispatch(mode).rows_read(_metadata(tasks, [3, 5])) is None


def test_a_pooler_that_does_not_say_rules_pruning_out():
    class Silent(torch.nn.Module):
        def forward(self, hidden, metadata):
            return list(hidden[:metadata.num_reqs])
    pooler = DispatchPooler({"embed": Silent()})
    assert pooler.rows_read(_metadata(["embed"], [4])) is None


# --- the BERT layer stack's routes ------------------------------------------------------

def _full_and_pruned(model: BertModel, lengths: list[int], rows: list[int] | None = None):
    inputs = packed_inputs(lengths)
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    rows = starts if rows is None else rows
    with torch.inference_mode():
        full = model(inputs)
        inputs.output_rows = torch.tensor(rows)
        pruned = model(inputs)
    return full[rows], pruned[rows]


def _spy_stack_layers(monkeypatch, module, name: str) -> list:
    """Record the num_layers each call of module.name got (None: the whole stack)."""
    calls, real = [], getattr(module, name)

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        if out is not None:
            calls.append(kwargs.get("num_layers"))
        return out
    monkeypatch.setattr(module, name, spy)
    return calls


needs_kernels = pytest.mark.skipif(encoder_kernels() is None,
                                   reason="CPU encoder kernels unavailable here")


@needs_kernels
@pytest.mark.parametrize("lengths", [[12], [5, 20, 9]])
def test_short_c_stack_step_one_layer_short_then_rows(kernel_build, monkeypatch, lengths):
    monkeypatch.setattr(bert, "C_STACK_PRUNE_MIN_TOKENS", 0)  # below it: the whole stack
    model = tiny_bert(layers=3)
    calls = _spy_stack_layers(monkeypatch, bert, "bert_layers_on_cpu")
    full, pruned = _full_and_pruned(model, lengths)
    torch.testing.assert_close(pruned, full, rtol=1e-5, atol=1e-5)
    assert calls == [None, 2]  # the full step in C, then the same call one layer short


@needs_kernels
def test_short_steps_below_the_threshold_keep_the_whole_c_stack(monkeypatch):
    assert bert.C_STACK_PRUNE_MIN_TOKENS >= bert_cpu.MAX_TOKENS  # the default: measured
    calls = _spy_stack_layers(monkeypatch, bert, "bert_layers_on_cpu")
    full, pruned = _full_and_pruned(tiny_bert(layers=3), [5, 20, 9])
    assert torch.equal(pruned, full)
    assert calls == [None, None]


@needs_kernels
def test_large_c_stack_step_one_layer_short_then_rows(kernel_build, monkeypatch):
    model = tiny_bert(layers=3)
    model.__dict__[bert_cpu.LARGE_STEPS] = True
    calls = _spy_stack_layers(monkeypatch, bert, "bert_layers_on_cpu")
    lengths = [60, 37, 100]
    rows = [59, 60 + 18, 97]  # any row of each sequence: last, middle, first
    full, pruned = _full_and_pruned(model, lengths, rows)
    torch.testing.assert_close(pruned, full, rtol=1e-5, atol=1e-5)
    assert calls == [None, 2]


def test_torch_layers_and_a_long_document(monkeypatch):
    torch.manual_seed(0)
    model = BertModel({"vocab_size": 100, "hidden_size": 48, "num_hidden_layers": 2,
                       "num_attention_heads": 3, "intermediate_size": 80,
                       "max_position_embeddings": 1200}).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    # a step the torch layers run whatever the kernels: the long-document route (1,100 tokens)
    full, pruned = _full_and_pruned(model, [1100, 9, 1])
    torch.testing.assert_close(pruned, full, rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(bert, "bert_layers_on_cpu", lambda *a, **k: None)  # torch layers only
    full, pruned = _full_and_pruned(model, [3, 40, 17])
    torch.testing.assert_close(pruned, full, rtol=1e-5, atol=1e-5)


@needs_kernels
def test_int8_c_stack_one_layer_short_then_its_own_last_layer(monkeypatch):
    monkeypatch.setattr(bert, "C_STACK_PRUNE_MIN_TOKENS", 0)  # int8 steps stay whole by default
    paths = runnable_paths()
    if not paths:
        pytest.skip("no int8 C build runs here")
    model = tiny_bert(layers=3)
    with torch.inference_mode():
        ranges = record_input_ranges(model, lambda: model(packed_inputs([30, 17, 12], seed=5)))
    # every linear of every layer int8 and smoothed, as an int8 engine's
    quantize_linears(model, keep_fp32=(), input_ranges=ranges)
    assert bert_int8_cpu.int8_stack_path(model) in paths
    calls = _spy_stack_layers(monkeypatch, bert, "int8_bert_layers_on_cpu")
    full, pruned = _full_and_pruned(model, [5, 20, 9])
    assert calls == [None, 2]
    # the same int8 layers, the same kernels; only the attention's float order differs
    # (measured 3.6e-7 here; a flipped activation code would move them ~1e-5)
    torch.testing.assert_close(pruned, full, rtol=1e-5, atol=1e-5)


def test_lora_or_a_score_bias_keep_every_row():
    model = tiny_bert()
    inputs = packed_inputs([4, 6])
    inputs.output_rows = torch.tensor([0, 4])
    assert bert.pruned_rows(model, inputs) is not None
    assert bert.pruned_rows(model, inputs, position_bias={4: torch.zeros(3, 4, 4)}) is None
    model.prunes_last_layer = False
    assert bert.pruned_rows(model, inputs) is None
