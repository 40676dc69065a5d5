"""Native Llama / Qwen2 / Qwen3 against transformers on seeded random tiny configs, the task
gating on real decoder folders, and the transformers fallback runner."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.models.tiny_task_models import random_ids, save_bert_task_model, save_decoder_model

LENGTHS = [5, 9, 1, 9, 13, 2]
FAMILIES = ["llama", "qwen2", "qwen3"]


def hf_run(path, cls_name, ids):
    """The reference, one unpadded sequence at a time."""
    import transformers

    model = getattr(transformers, cls_name).from_pretrained(path).eval()
    out = []
    for x in ids:
        with torch.no_grad():
            result = model(torch.tensor([x]))
        out.append((result.last_hidden_state if hasattr(result, "last_hidden_state")
                    else result.logits)[0].numpy())
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_decoder_embed_last_token_matches_transformers(tmp_path, family):
    from pooler import Engine

    path = save_decoder_model(tmp_path / "m", family, "causal")
    engine = Engine(str(path))
    assert engine.supported_tasks == {"embed"}  # token_embed gated off for decoders
    ids = random_ids(LENGTHS, 97)
    hidden = hf_run(path, "AutoModel", ids)
    out = engine.embed(ids, normalize=False)  # one mixed-length packed batch
    for o, h in zip(out, hidden):
        np.testing.assert_allclose(o.embedding, h[-1], atol=1e-5)
    normalized = engine.embed(ids[:2])
    np.testing.assert_allclose(np.linalg.norm(normalized[0].embedding), 1.0, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_decoder_sequence_classification_matches_transformers(tmp_path, family):
    from pooler import Engine

    path = save_decoder_model(tmp_path / "m", family, "seq", num_labels=3)
    engine = Engine(str(path))
    ids = random_ids(LENGTHS, 97)
    ids.append([5, 6, 7, 0, 0])  # ends in the pad id: transformers scores token 7
    logits = np.stack(hf_run(path, "AutoModelForSequenceClassification", ids))
    expected = torch.tensor(logits).softmax(-1).numpy()
    got = np.stack([o.probs for o in engine.classify(ids)])
    np.testing.assert_allclose(got, expected, atol=1e-5)


@pytest.mark.parametrize("window", [4, None])
def test_mistral_is_the_llama_path_with_its_sliding_window(tmp_path, window):
    """Mistral runs on the Llama code; a window of 4 (shorter than most LENGTHS) must limit
    each query to the 4 keys ending at itself, as transformers' sliding-window mask does."""
    from pooler import Engine

    base = save_decoder_model(tmp_path / "base", "mistral", "causal", sliding_window=window)
    engine = Engine(str(base))
    assert engine.model_config.architecture == "MistralForCausalLM"
    ids = random_ids(LENGTHS, 97)
    hidden = hf_run(base, "AutoModel", ids)
    [single] = engine.embed(ids[4], normalize=False)
    np.testing.assert_allclose(single.embedding, hidden[4][-1], atol=1e-5)
    for o, h in zip(engine.embed(ids, normalize=False), hidden):
        np.testing.assert_allclose(o.embedding, h[-1], atol=1e-5)
    seq = save_decoder_model(tmp_path / "seq", "mistral", "seq", num_labels=3,
                             sliding_window=window)
    logits = np.stack(hf_run(seq, "AutoModelForSequenceClassification", ids))
    got = np.stack([o.probs for o in Engine(str(seq)).classify(ids, use_activation=False)])
    np.testing.assert_allclose(got, logits, atol=1e-5)


def test_causal_sliding_window_mask_stays_causal():
    """packed_attention with causal=True and a window: no query sees a later key."""
    from pooler.layers.attention import packed_attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(7, 2, 8) for _ in range(3))
    out = packed_attention(q, k, v, [7], torch.tensor([0, 7], dtype=torch.int32), 7,
                           causal=True, half_window=2)
    for i in range(7):
        lo = max(0, i - 2)
        ref = torch.nn.functional.scaled_dot_product_attention(
            q[None, i:i + 1].transpose(1, 2), k[None, lo:i + 1].transpose(1, 2),
            v[None, lo:i + 1].transpose(1, 2))[0].transpose(0, 1)
        torch.testing.assert_close(out[i:i + 1], ref, atol=1e-6, rtol=0)


def test_decoder_token_tasks_are_gated(tmp_path):
    from pooler import Engine

    base = save_decoder_model(tmp_path / "base", "qwen3", "base")
    with pytest.raises(ValueError, match="Set an explicitly supported task: task='embed'"):
        Engine(str(base), task="token_embed")
    token = save_decoder_model(tmp_path / "token", "llama", "token", num_labels=4)
    with pytest.raises(ValueError) as info:
        Engine(str(token))
    assert "explicitly supported task" not in str(info.value)
    assert "runner='transformers'" in str(info.value)


def test_decoder_rejects_sentence_pairs(tmp_path):
    from pooler import Engine

    engine = Engine(str(save_decoder_model(tmp_path / "m", "llama", "seq")))
    with pytest.raises(ValueError, match="does not take sentence pairs: it is a decoder"):
        engine.classify("t1 t2", text_pair="t3")


# ---- fallback runner ------------------------------------------------------------------------
def test_fallback_serves_token_classify_on_a_decoder(tmp_path):
    from pooler import Engine

    path = save_decoder_model(tmp_path / "m", "qwen3", "token", num_labels=4)
    engine = Engine(str(path), runner="transformers")
    assert engine.supported_tasks == {"token_classify"}
    ids = random_ids(LENGTHS, 97)
    outputs = engine.token_classify(ids)  # one right-padded batch
    for o, logits in zip(outputs, hf_run(path, "AutoModelForTokenClassification", ids)):
        np.testing.assert_allclose(o.probs, torch.tensor(logits).softmax(-1).numpy(),
                                   atol=1e-5)


def test_fallback_token_embed_and_embed_on_a_decoder(tmp_path):
    from pooler import Engine

    path = save_decoder_model(tmp_path / "m", "llama", "base")
    engine = Engine(str(path), runner="transformers")
    assert engine.supported_tasks == {"embed", "token_embed"}
    ids = random_ids(LENGTHS, 97)
    hidden = hf_run(path, "AutoModel", ids)
    tokens = engine.token_embed(ids, normalize=False)
    pooled = engine.embed(ids, normalize=False)
    for t, p, h in zip(tokens, pooled, hidden):
        assert t.embeddings.shape == h.shape
        np.testing.assert_allclose(t.embeddings, h, atol=1e-5)
        np.testing.assert_allclose(p.embedding, h[-1], atol=1e-5)


def test_fallback_classify_on_an_encoder_with_pairs(tmp_path):
    from pooler import Engine

    path = save_bert_task_model(tmp_path / "m", "seq", num_labels=2)
    native = Engine(str(path))
    fallback = Engine(str(path), runner="transformers")
    texts, pairs = ["a cat", "the capital of france is paris"], ["a dog", "paris"]
    np.testing.assert_allclose(
        np.stack([o.probs for o in fallback.classify(texts, text_pair=pairs)]),
        np.stack([o.probs for o in native.classify(texts, text_pair=pairs)]), atol=1e-5)
    with pytest.raises(ValueError, match="Unsupported task: 'embed'"):
        fallback.embed("x")
    with pytest.raises(ValueError, match="not supported by this model"):
        Engine(str(path), runner="transformers", task="embed")


@pytest.mark.parametrize("option", [{"dtype": "bfloat16"}, {"quantization": "int8"}])
def test_bf16_and_int8_engines_let_decoder_attention_round_to_bf16(tmp_path, monkeypatch,
                                                                   option):
    """Decoder attention gets fp32 q/k/v from bf16 and int8 linears alike; both engines set
    attention_bf16_products on it (bf16 only where the bf16 linears were kept), so long causal
    sequences may run SDPA in bf16 on AMX (attention_cpu._bf16_long_routes), within bf16's
    error of the fp32 engine."""
    import torch.nn.functional as F

    from pooler import Engine
    from pooler.kernels import attention_cpu
    from pooler.layers.linear import Bf16Linear
    from pooler.models.llama import Attention

    import json

    path = save_decoder_model(tmp_path / "m", "qwen3", "causal", max_position_embeddings=256)
    (path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 256}))
    ids = random_ids([200, 7], 97, seed=5)
    want = np.stack([o.embedding for o in Engine(str(path)).embed(ids)])
    monkeypatch.setattr(attention_cpu, "BF16_SDPA_MIN_LEN", 64)
    # every layer's full attention (the pooled-rows route runs the last one on the last
    # token alone: pooler/worker/pooled_rows.py)
    monkeypatch.setenv("POOLER_PRUNE_LAST_LAYER", "0")
    calls = []
    real = F.scaled_dot_product_attention

    def spy(qs, *args, **kwargs):
        calls.append((qs.shape[2], qs.dtype, kwargs.get("is_causal")))
        return real(qs, *args, **kwargs)
    monkeypatch.setattr(attention_cpu.F, "scaled_dot_product_attention", spy)
    engine = Engine(str(path), precision_check="off", **option)
    model = engine.core.model_runner.model
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    rounded = "quantization" in option or any(isinstance(m, Bf16Linear) for m in model.modules())
    assert layers and all(m.attention_bf16_products == rounded for m in layers)
    calls.clear()
    got = np.stack([o.embedding for o in engine.embed(ids)])
    routed = rounded and attention_cpu.bf16_sdpa_is_fast() and \
        attention_cpu.encoder_kernels() is not None
    assert (calls == [(200, torch.bfloat16, True)] * len(layers)) == routed, calls
    cos = (want * got).sum(axis=1) / (np.linalg.norm(want, axis=1) * np.linalg.norm(got, axis=1))
    assert cos.min() > 0.999, cos
