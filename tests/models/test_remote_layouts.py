"""The checkpoints as people download them: nomic-embed-text, gte-*-v1.5 and
jina-embeddings-v3 in their original remote-code layouts (config keys, weight names, `auto_map`)
load natively, without running any repository code, and match transformers 5.24's own classes
on the same weights (fp32, atol 1e-5, mixed batches and single inputs)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pooler import Engine
from pooler.params import PoolingParams
from tests.models.remote_layout_folders import (JINA_TASKS, build_gte_remote, build_jina_remote,
                                                build_nomic_remote, jina_reference_with_adapter)
from tests.models.rotary_folders import TEXTS, require_family

ATOL = 1e-5


def _hidden(model, folder, texts=TEXTS):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    batch = tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(**batch)
    return batch["attention_mask"].sum(1).tolist(), out


def _check_hidden(engine, lengths, ref):
    got = engine.token_embed(TEXTS, normalize=False)
    for i, (n, out) in enumerate(zip(lengths, got)):
        np.testing.assert_allclose(out.embeddings, ref.last_hidden_state[i, :n].numpy(),
                                   atol=ATOL, err_msg=f"text {i}")
    alone = engine.token_embed(TEXTS[1], normalize=False)[0]
    np.testing.assert_allclose(alone.embeddings, ref.last_hidden_state[1, :lengths[1]].numpy(),
                               atol=ATOL)


def test_nomic_remote_layout(tmp_path):
    require_family("nomic_bert")
    folder = tmp_path / "nomic"
    model = build_nomic_remote(folder)
    assert "auto_map" in json.loads((folder / "config.json").read_text())
    lengths, ref = _hidden(model, folder)
    engine = Engine(str(folder), device="cpu")  # runner auto: native, no remote code
    assert engine.model_config.runner == "native"
    _check_hidden(engine, lengths, ref)


@pytest.mark.parametrize("ntk_factor", [None, 2.0])
def test_gte_new_model_layout(tmp_path, ntk_factor):
    require_family("gte")
    folder = tmp_path / "gte"
    model = build_gte_remote(folder, ntk_factor=ntk_factor)
    lengths, ref = _hidden(model, folder)
    _check_hidden(Engine(str(folder), device="cpu"), lengths, ref)


def test_gte_ntk_scaling_changes_the_states(tmp_path):
    """The NTK branch matters: the same weights without it give other states."""
    require_family("gte")
    plain, scaled = tmp_path / "plain", tmp_path / "ntk"
    build_gte_remote(plain)
    build_gte_remote(scaled, ntk_factor=2.0)
    a = Engine(str(plain), device="cpu").token_embed(TEXTS[1], normalize=False)[0].embeddings
    b = Engine(str(scaled), device="cpu").token_embed(TEXTS[1], normalize=False)[0].embeddings
    assert np.abs(a - b).max() > 1e-3


def test_gte_new_reranker_layout(tmp_path):
    """gte-multilingual-reranker-base: NewForSequenceClassification, encoder under `new.`,
    `new.pooler.dense` + `classifier`."""
    require_family("gte", "ForSequenceClassification")
    folder = tmp_path / "rerank"
    model = build_gte_remote(folder, seed=1, head="ForSequenceClassification")
    _, ref = _hidden(model, folder)
    engine = Engine(str(folder), device="cpu")
    logits = engine.encode(TEXTS, PoolingParams(task="classify", use_activation=False))
    np.testing.assert_allclose(np.stack([o.data for o in logits]), ref.logits.numpy(), atol=ATOL)


@pytest.mark.parametrize("task", ["text-matching", "retrieval.query"])
def test_jina_lora_layout_serves_the_chosen_adapter(tmp_path, task):
    require_family("jina_embeddings_v3")
    folder = tmp_path / "jina"
    rank, alpha = 2, 3.0
    model, base, factors = build_jina_remote(folder, rank=rank, alpha=alpha)
    ref_model = jina_reference_with_adapter(model, base, factors, task, alpha, rank)
    lengths, ref = _hidden(ref_model, folder)
    overrides = None if task == "text-matching" else {"lora_task": task}
    engine = Engine(str(folder), device="cpu", hf_overrides=overrides)
    _check_hidden(engine, lengths, ref)
    # Another adapter gives other states: the choice is real.
    other = jina_reference_with_adapter(model, base, factors, "separation", alpha, rank)
    _, ref_other = _hidden(other, folder)
    assert (ref_other.last_hidden_state - ref.last_hidden_state).abs().max() > 1e-3


def test_jina_unknown_adapter_is_a_clear_error(tmp_path):
    require_family("jina_embeddings_v3")
    folder = tmp_path / "jina"
    build_jina_remote(folder)
    with pytest.raises(ValueError, match="lora_task 'retrieval' is not one of .*text-matching"):
        Engine(str(folder), device="cpu", hf_overrides={"lora_task": "retrieval"})
    assert JINA_TASKS[-1] == "text-matching"


def test_remote_layout_refuses_the_fallback_runner(tmp_path):
    require_family("nomic_bert")
    folder = tmp_path / "nomic"
    build_nomic_remote(folder)
    with pytest.raises(ValueError, match="remote-code layout.*drop runner='transformers'"):
        Engine(str(folder), device="cpu", runner="transformers")
