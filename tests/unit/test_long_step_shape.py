"""The precision gates' long-document step (pooler/worker/long_step_shape.py): only for models
that take documents past the long paths' threshold, and the bf16 gate times it, so a bf16 path
slower on long documents alone falls back (fake timings decide here)."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from pooler.layers.attention_long import CHUNKED_MIN_LEN
from pooler.layers.linear import Bf16Linear
from pooler.worker.long_step_shape import LONG_STEP_TOKENS, long_step_shape


def _config(max_model_len: int):
    return SimpleNamespace(max_model_len=max_model_len, hf_config={"vocab_size": 300},
                           torch_device=torch.device("cpu"))


def test_only_models_that_take_long_documents_get_the_step():
    assert long_step_shape(_config(512)) is None
    assert long_step_shape(_config(CHUNKED_MIN_LEN)) is None
    name, inputs = long_step_shape(_config(8192))
    assert name == f"1x{LONG_STEP_TOKENS} tokens" and inputs.seq_lens == [LONG_STEP_TOKENS]
    assert inputs.max_seqlen > CHUNKED_MIN_LEN and int(inputs.input_ids.max()) < 300
    assert inputs.cu_seqlens.tolist() == [0, LONG_STEP_TOKENS]
    _, shorter = long_step_shape(_config(1200))  # capped at the model's length
    assert shorter.seq_lens == [1200]


def test_bf16_gate_falls_back_when_only_the_long_step_is_slower(tmp_path, monkeypatch):
    import pooler.cpu_features as cf
    from pooler.config import ModelConfig
    from pooler.loader import build_model
    from pooler.worker.cpu_bf16 import CHECK_SHAPES, choose_cpu_bf16
    from tests.models.modernbert_folders import build_modernbert, save_tokenizer

    monkeypatch.setenv(cf.FLAGS_ENV, "avx2 fma avx512f avx512bw avx512_bf16")
    cf.cpu_features.cache_clear()
    build_modernbert(tmp_path, max_position_embeddings=4096, local_attention=128)
    save_tokenizer(tmp_path, model_max_length=4096)
    config = ModelConfig(model=str(tmp_path), device="cpu", dtype="bfloat16")
    assert config.max_model_len > CHUNKED_MIN_LEN
    backbone = build_model(ModelConfig(model=str(tmp_path), device="cpu")).backbone
    lengths = []
    forward = backbone.forward
    backbone.forward = lambda inputs, *a, **k: (lengths.append(inputs.max_seqlen),
                                                forward(inputs, *a, **k))[1]

    def measure(fn):  # bf16 twice as fast on short steps, slower on the long one
        fn()
        bf16 = any(isinstance(m, Bf16Linear) for m in backbone.modules())
        long = lengths[-1] > CHUNKED_MIN_LEN
        return (1.5 if long else 0.5) if bf16 else 1.0

    try:
        decision = choose_cpu_bf16(backbone, config, measure=measure)
    finally:
        cf.cpu_features.cache_clear()
    names = [name for name, _, _ in decision.timings]
    assert names[-1] == f"1x{LONG_STEP_TOKENS} tokens" and len(names) == len(CHECK_SHAPES) + 1
    assert not decision.use_candidate and "1536 tokens" in decision.reason
    assert not any(isinstance(m, Bf16Linear) for m in backbone.modules())
