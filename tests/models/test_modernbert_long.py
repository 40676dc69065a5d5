"""ModernBERT at ~2k tokens (a tiny seeded model with a long max_position_embeddings and the
real 128-token local window) against transformers, fp32, atol 1e-4: the local layers on the C
kernel's band, and on the torch path's blocked band (the kernel off), as a GQA or causal model
or a machine without the kernel would run them."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pooler import Engine
from pooler.kernels import attention_cpu
from tests.models.modernbert_folders import CORPUS, build_modernbert, save_tokenizer

ATOL = 1e-4
MAX_LEN = 4096


@pytest.fixture(scope="module")
def long_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("modernbert_long")
    model = build_modernbert(folder, "ModernBertModel", seed=1, hidden_size=64,
                             intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
                             local_attention=128, max_position_embeddings=MAX_LEN)
    save_tokenizer(folder, model_max_length=MAX_LEN)
    return folder, model


@pytest.mark.parametrize("path", ["kernel", "torch"])
def test_two_thousand_tokens_match_transformers(long_folder, path, monkeypatch):
    from transformers import AutoTokenizer

    folder, model = long_folder
    text = " ".join(CORPUS[:5] * 12)
    tok = AutoTokenizer.from_pretrained(folder)
    ids = tok(text, return_tensors="pt")
    length = ids["input_ids"].shape[1]
    assert 1500 < length < MAX_LEN, length
    with torch.no_grad():
        expected = model(**ids).last_hidden_state[0].numpy()  # [length, hidden]
    if path == "torch":
        monkeypatch.setattr(attention_cpu, "ENABLED", False)
    engine = Engine(str(folder), device="cpu", max_model_len=MAX_LEN)
    got = engine.token_embed(text, normalize=False)[0].embeddings
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, atol=ATOL)
