"""Long fp32 steps of the rotary encoders and BERT write their widest activations (fused q/k/v,
the MLP's up projection or gated [gate | up], and the gated product) into one workspace the
layers share (pooler/layers/workspace.py): same numbers as the per-layer allocations, and the
same memory reused by every layer."""
from __future__ import annotations

import pytest
import torch

from pooler.layers import workspace as workspace_module
from pooler.models.bert import BertModel
from pooler.models.eurobert import EuroBertModel
from pooler.models.gte import GteModel
from pooler.models.inputs import ModelInputs
from pooler.models.jina_embeddings_v3 import JinaEmbeddingsV3Model
from pooler.models.nomic_bert import NomicBertModel

LENGTH = workspace_module.MIN_ROWS  # the shortest step that takes the workspace
CONFIG = dict(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
              num_attention_heads=4, max_position_embeddings=LENGTH)
# buffer names, and takes per layer: q/k/v and [gate | up] (or the up projection) share "wide"
# (q/k/v is dead once attention has run)
GATED = ({"wide", "mlp_product"}, 3)
MODELS = {  # GeGLU post-norm, SwiGLU post-norm, SwiGLU pre-norm with grouped-query heads, and
    # BERT's plain GELU MLP (XLM-R positions, as BGE-M3's encoder)
    "gte": (GteModel, {}, GATED),
    "nomic_bert": (NomicBertModel, {"type_vocab_size": 2}, GATED),
    "eurobert": (EuroBertModel, {"num_key_value_heads": 2, "hidden_act": "silu"}, GATED),
    # a rotary encoder's plain GELU MLP (fc1 into "wide", GELU in place)
    "jina_v3": (JinaEmbeddingsV3Model, {"type_vocab_size": 1}, ({"wide"}, 2)),
    "xlm_roberta": (BertModel, {"model_type": "xlm-roberta", "pad_token_id": 1,
                                "max_position_embeddings": LENGTH + 2, "type_vocab_size": 1},
                    ({"wide"}, 2)),
}


def _inputs(length: int) -> ModelInputs:
    ids = torch.randint(0, CONFIG["vocab_size"], (length,),
                        generator=torch.Generator().manual_seed(1))
    return ModelInputs(input_ids=ids, positions=torch.arange(length), token_type_ids=None,
                       cu_seqlens=torch.tensor([0, length], dtype=torch.int32),
                       seq_lens=[length], max_seqlen=length)


@pytest.mark.parametrize("family", list(MODELS))
def test_long_step_reuses_one_workspace_with_the_same_result(family, monkeypatch):
    cls, extra, (buffers, takes_per_layer) = MODELS[family]
    monkeypatch.setattr(workspace_module, "MIN_WIDE_BYTES", 0)  # tiny widths: blocks are small
    torch.manual_seed(0)
    model = cls({**CONFIG, **extra}).eval()
    inputs = _inputs(LENGTH)
    taken = []  # (name, data pointer) of every buffer handed out
    take = workspace_module.Workspace.take

    def spy(self, name, rows, cols):
        buf = take(self, name, rows, cols)
        taken.append((name, buf.data_ptr()))
        return buf

    monkeypatch.setattr(workspace_module.Workspace, "take", spy)
    with torch.inference_mode():
        got = model(inputs)
        monkeypatch.setattr(workspace_module, "MIN_ROWS", LENGTH + 1)  # the per-layer path
        expected = model(inputs)
    names = {name for name, _ in taken}
    assert names == buffers
    # the forward reserves "wide" once at its larger width; none taken on the short path
    assert len(taken) == 1 + takes_per_layer * CONFIG["num_hidden_layers"]
    for name in names:  # every layer wrote into the first layer's buffer
        assert len({ptr for n, ptr in taken if n == name}) == 1
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_short_steps_small_blocks_and_autograd_keep_their_own_allocations():
    for_step = workspace_module.Workspace.for_step
    wide = workspace_module.MIN_WIDE_BYTES // 4 // LENGTH  # columns whose block meets the ceiling
    with torch.inference_mode():
        assert for_step(torch.zeros(LENGTH, 8), wide) is not None
        assert for_step(torch.zeros(LENGTH - 1, 8), 2 * wide) is None  # too few rows
        assert for_step(torch.zeros(LENGTH, 8), wide - 1) is None  # under the mmap ceiling
        assert for_step(torch.zeros(LENGTH, 8, dtype=torch.bfloat16), wide) is None
    with torch.enable_grad():
        assert for_step(torch.zeros(LENGTH, 8), wide) is None


def test_bert_long_document_leaves_the_c_stack_for_the_long_route(monkeypatch):
    """A model whose large steps the load-time check gave to the C stack still runs a step
    holding a long document (the long-attention route's length: FLASH_MIN_LEN where the flash
    kernel runs, else SDPA_MIN_LEN) on the torch layers, whose attention takes that route; a
    step of shorter sequences keeps the C stack."""
    from pooler.kernels import attention_cpu, bert_cpu
    from pooler.kernels.build import encoder_kernels

    lib = encoder_kernels()
    if lib is None:
        pytest.skip("the C kernels are not built here")
    head_dim = CONFIG["hidden_size"] // CONFIG["num_attention_heads"]
    long_len = attention_cpu.FLASH_MIN_LEN if attention_cpu.flash_route_here(
        lib.variant, head_dim) else attention_cpu.SDPA_MIN_LEN
    cls, extra, _ = MODELS["xlm_roberta"]
    torch.manual_seed(0)
    model = cls({**CONFIG, **extra}).eval()
    model.__dict__[bert_cpu.LARGE_STEPS] = True
    stack_calls = []
    stack = bert_cpu.bert_layers_on_cpu

    def spy(*args, **kwargs):
        stack_calls.append(args[1].shape[0])
        return stack(*args, **kwargs)

    monkeypatch.setattr("pooler.models.bert.bert_layers_on_cpu", spy)
    half = long_len - 1  # two sequences, each just short of the long route's length
    short = ModelInputs(input_ids=torch.ones(2 * half, dtype=torch.long),
                        positions=torch.arange(half).repeat(2), token_type_ids=None,
                        cu_seqlens=torch.tensor([0, half, 2 * half], dtype=torch.int32),
                        seq_lens=[half, half], max_seqlen=half)
    with torch.inference_mode():
        long_out = model(_inputs(LENGTH))
        assert stack_calls == []  # the long document: torch layers
        model(short)
    assert stack_calls == [2 * half]
    # the torch layers' result is the transformers-equal one the parity tests check; here
    # only that it is finite and shaped
    assert long_out.shape == (LENGTH, CONFIG["hidden_size"]) and torch.isfinite(long_out).all()
