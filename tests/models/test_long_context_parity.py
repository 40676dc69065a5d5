"""Every long-context family at 8,192 tokens against transformers on the same folder, fp32,
atol 1e-4 (issue 42 "parity unchanged"): ModernBERT (global and 128-token local layers),
NomicBert, GTE, Jina v3 (rotary XLM-R) and BGE-M3's encoder (XLM-R, learned positions up to
8,194). Tiny seeded models (hidden 64, 2-3 layers) keep an 8k forward to about a second; each
runs on this CPU's best kernel build and on the AVX2 build forced (POOLER_CPU_KERNELS=avx2),
ModernBERT also with the attention kernel off (the torch path's blocked band).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pooler import Engine
from pooler.kernels import attention_cpu
from pooler.worker import model_runner
from tests.models.modernbert_folders import build_modernbert, save_tokenizer
from tests.models.rotary_folders import build_family, require_family

ATOL = 1e-4
LENGTH = 8192
SIZES = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4)


def _save_xlm_roberta(folder):
    """BGE-M3's encoder shape in small: XLMRobertaModel, <s>=0 <pad>=1 </s>=2, positions after
    the padding index up to 8,194 (8,192 tokens), one token type."""
    from transformers import XLMRobertaConfig, XLMRobertaModel

    folder.mkdir(parents=True, exist_ok=True)
    save_tokenizer(folder, model_max_length=LENGTH)
    torch.manual_seed(0)
    config = XLMRobertaConfig(vocab_size=300, num_hidden_layers=2, **SIZES,
                              max_position_embeddings=LENGTH + 2, type_vocab_size=1,
                              pad_token_id=1, bos_token_id=0, eos_token_id=2)
    model = XLMRobertaModel(config, add_pooling_layer=False).eval()
    model.save_pretrained(folder)
    return model, (0, 2)


def _save_modernbert(folder):
    model = build_modernbert(folder, "ModernBertModel", seed=1, num_hidden_layers=3,
                             local_attention=128, max_position_embeddings=LENGTH, **SIZES)
    save_tokenizer(folder, model_max_length=LENGTH)
    return model, (1, 2)


def _rotary(family: str, max_positions: int = LENGTH):
    def save(folder):
        require_family(family)
        model = build_family(folder, family, num_hidden_layers=2,
                             max_position_embeddings=max_positions, **SIZES)
        save_tokenizer(folder, model_max_length=LENGTH)
        return model, (1, 2)
    return save


BUILDERS = {
    "modernbert": _save_modernbert,
    "nomic_bert": _rotary("nomic_bert"),
    "gte": _rotary("gte"),
    "jina_embeddings_v3": _rotary("jina_embeddings_v3", LENGTH + 2),
    "xlm_roberta": _save_xlm_roberta,
}


@pytest.fixture(scope="module", params=list(BUILDERS))
def long_family(request, tmp_path_factory):
    """(family, folder, token ids of one 8,192-token document, transformers' hidden states)."""
    family = request.param
    folder = tmp_path_factory.mktemp(family)
    model, (cls_id, sep_id) = BUILDERS[family](folder)
    generator = torch.Generator().manual_seed(7)
    ids = [cls_id] + torch.randint(5, 300, (LENGTH - 2,), generator=generator).tolist() \
        + [sep_id]
    with torch.no_grad():
        expected = model(input_ids=torch.tensor([ids]),
                         attention_mask=torch.ones(1, LENGTH, dtype=torch.long))
    return family, folder, ids, expected.last_hidden_state[0].numpy()  # [8192, hidden]


def _pooler_hidden(folder, ids) -> np.ndarray:
    engine = Engine(str(folder), device="cpu", max_model_len=LENGTH)
    [out] = engine.token_embed({"prompt_token_ids": ids}, normalize=False)
    return out.embeddings  # [8192, hidden]


@pytest.mark.parametrize("kernels", ["best", "avx2"])
def test_eight_thousand_tokens_match_transformers(long_family, kernels, monkeypatch):
    family, folder, ids, expected = long_family
    if kernels == "avx2":
        monkeypatch.setenv("POOLER_CPU_KERNELS", "avx2")
    scopes = []  # the step's forward serves its 32 MB blocks from the heap (memory.py)
    heap_scope = model_runner.large_blocks_from_heap
    monkeypatch.setattr(model_runner, "large_blocks_from_heap",
                        lambda active: scopes.append(active) or heap_scope(active))
    got = _pooler_hidden(folder, ids)
    assert True in scopes
    assert got.shape == expected.shape == (LENGTH, SIZES["hidden_size"])
    np.testing.assert_allclose(got, expected, atol=ATOL, err_msg=f"{family} ({kernels})")


def test_modernbert_local_layers_on_the_torch_path(long_family, monkeypatch):
    """The attention kernel off: the local layers take the torch path's blocked band."""
    family, folder, ids, expected = long_family
    if family != "modernbert":
        pytest.skip("the banded local layers are ModernBERT's")
    monkeypatch.setattr(attention_cpu, "ENABLED", False)
    np.testing.assert_allclose(_pooler_hidden(folder, ids), expected, atol=ATOL)
