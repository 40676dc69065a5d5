"""LoRA adapters (issue 31): each adapter's output equals peft's merged model
(merge_and_unload) run through the reference library, fp32 <= 1e-5, alone and in batches that
mix adapters and the base; bad adapters are refused at load, naming the mismatch, and nothing
served changes.

Seeded random tiny models and seeded random adapters (every LoRA weight drawn, so no update
is zero), saved by peft to tmp folders: BERT (embed, sentence-transformers mean pooling),
RoBERTa (classify, classifier saved whole), BERT (classify, LoRA on the classifier),
ModernBERT (token_classify, LoRA on the fused Wqkv and the head), DistilBERT and MPNet (embed).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from pooler.engine.llm import Engine
from pooler.engine.lora import UnknownLoraError
from pooler.params import PoolingParams
from tests.models.encoder_folders import hf_outputs, save_distilbert, save_electra, save_mpnet
from tests.models.lora_folders import save_lora, save_merged
from tests.models.modernbert_folders import TEXTS as MODERNBERT_TEXTS
from tests.models.modernbert_folders import build_modernbert
from tests.models.tiny import add_st_pooling, save_tiny_bert
from tests.models.tiny_task_models import (minilm_path, save_bert_task_model,
                                           save_roberta_seq_model)

pytest.importorskip("peft")

ATOL = 1e-5
TEXTS = ["the quick brown fox jumps over the lazy dog", "a cat sat on the mat",
         "pooler serves embedding models", "what is the capital of france",
         "paris is the capital of france and its largest city by far", "berlin"]


def _st_reference(folder, texts=TEXTS) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(folder), device="cpu").encode(texts, convert_to_numpy=True)


def _mixed_run(engine: Engine, task: str, texts: list[str], loras: list[str | None],
               **params) -> tuple[list[np.ndarray], int]:
    """All texts submitted together, each with its own adapter; returns the outputs and how
    many forward steps computed them."""
    steps = []
    runner = engine.core.model_runner
    execute = runner.execute_model

    def counting(scheduler_output):
        if scheduler_output.scheduled_new_reqs:
            steps.append(len(scheduler_output.scheduled_new_reqs))
        return execute(scheduler_output)

    runner.execute_model = counting
    try:
        processed = engine.processor.process(texts)
        results = engine.run_processed(processed, [
            engine.verify_params(PoolingParams(task=task, lora=lora, **params))
            for lora in loras])
    finally:
        runner.execute_model = execute
    return [r.data.numpy() for r in results], len(steps)


# ---- BERT embed (sentence-transformers reference) --------------------------------------
@pytest.fixture(scope="module")
def bert_embed(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_bert")
    base = save_bert_task_model(root / "base", "base", seed=1)
    add_st_pooling(base, "mean")
    adapters = {
        # every linear of the encoder (fused q/k/v split three ways), rank 4
        "all": save_lora(base, root / "all", "BertModel", seed=2, r=4, lora_alpha=8,
                         target_modules=["query", "key", "value", "dense"]),
        # q and v only, rsLoRA scaling, a rank and an alpha per layer kind
        "qv": save_lora(base, root / "qv", "BertModel", seed=3, r=2, lora_alpha=4,
                        use_rslora=True, target_modules=["query", "value"],
                        rank_pattern={"value": 3}, alpha_pattern={"query": 16}),
    }
    refs = {None: _st_reference(base)}
    for name, path in adapters.items():
        refs[name] = _st_reference(save_merged(base, path, root / f"merged_{name}", "BertModel"))
    return base, adapters, refs


def test_bert_embed_each_adapter_equals_merged(bert_embed):
    base, adapters, refs = bert_embed
    engine = Engine(str(base), lora_modules={k: str(v) for k, v in adapters.items()})
    for name in (None, "all", "qv"):
        ours = np.stack([o.embedding for o in engine.embed(TEXTS, lora=name)])
        np.testing.assert_allclose(ours, refs[name], atol=ATOL, err_msg=str(name))
        alone = engine.embed(TEXTS[1], lora=name)[0].embedding  # a one-text step
        np.testing.assert_allclose(alone, refs[name][1], atol=ATOL, err_msg=str(name))
    assert np.abs(refs["all"] - refs[None]).max() > 1e-2  # the adapters do change outputs
    assert np.abs(refs["qv"] - refs[None]).max() > 1e-2


def test_bert_embed_mixed_batch_is_one_step(bert_embed):
    base, adapters, refs = bert_embed
    engine = Engine(str(base), lora_modules={k: str(v) for k, v in adapters.items()})
    loras = ["qv", None, "all", "qv", None, "all"]
    outputs, steps = _mixed_run(engine, "embed", TEXTS, loras)
    assert steps == 1
    for i, (out, lora) in enumerate(zip(outputs, loras)):
        np.testing.assert_allclose(out, refs[lora][i], atol=ATOL, err_msg=f"text {i} {lora}")


def test_max_loras_reads_evicted_adapters_back(bert_embed):
    """max_loras=1: a mixed batch is split into steps of one adapter each, the other adapter
    is dropped and read back from disk, and every output still equals its merged model."""
    base, adapters, refs = bert_embed
    engine = Engine(str(base), lora_modules={k: str(v) for k, v in adapters.items()},
                    max_loras=1)
    manager = engine.core.model_runner.lora
    loras = ["qv", "all", None, "qv", "all", None]
    outputs, steps = _mixed_run(engine, "embed", TEXTS, loras)
    assert steps >= 2 and len(manager.resident) == 1 and manager.loads_from_disk >= 1
    for i, (out, lora) in enumerate(zip(outputs, loras)):
        np.testing.assert_allclose(out, refs[lora][i], atol=ATOL, err_msg=f"text {i} {lora}")


def test_unknown_adapter_names_the_known_ones(bert_embed):
    base, adapters, _ = bert_embed
    engine = Engine(str(base), lora_modules={"all": str(adapters["all"])})
    with pytest.raises(UnknownLoraError, match=r"'nope'.*\['all'\]"):
        engine.embed("x", lora="nope")
    with pytest.raises(ValueError, match="nope"):
        engine.encode("x", PoolingParams(task="embed", lora="nope"))


def test_load_and_unload_at_run_time(bert_embed):
    base, adapters, refs = bert_embed
    engine = Engine(str(base), enable_lora=True)
    assert engine.lora_names == []
    engine.add_lora("qv", str(adapters["qv"]))
    ours = np.stack([o.embedding for o in engine.embed(TEXTS, lora="qv")])
    np.testing.assert_allclose(ours, refs["qv"], atol=ATOL)
    with pytest.raises(ValueError, match="already loaded"):
        engine.add_lora("qv", str(adapters["all"]))
    engine.remove_lora("qv")
    with pytest.raises(UnknownLoraError):
        engine.embed("x", lora="qv")
    base_out = np.stack([o.embedding for o in engine.embed(TEXTS)])
    np.testing.assert_allclose(base_out, refs[None], atol=ATOL)


def test_adapter_for_another_base_is_refused(bert_embed, tmp_path):
    """Wider hidden size, ranks the config does not declare, a rank above max_lora_rank, a
    layer the model lacks, DoRA: each refused at load naming the cause; what was served
    still gives the same outputs."""
    base, adapters, refs = bert_embed
    engine = Engine(str(base), lora_modules={"all": str(adapters["all"])}, max_lora_rank=8)
    before = np.stack([o.embedding for o in engine.embed(TEXTS, lora="all")])

    wide = save_tiny_bert(tmp_path / "wide", minilm_path(), seed=5, hidden_size=48)
    wide_adapter = save_lora(wide, tmp_path / "wide_lora", "BertModel", seed=6, r=4,
                             target_modules=["query", "value"])
    with pytest.raises(ValueError, match=r"48 inputs.*32.*another base"):
        engine.add_lora("wide", str(wide_adapter))

    bad_rank = tmp_path / "bad_rank"
    bad_rank.mkdir()
    for f in adapters["all"].iterdir():
        (bad_rank / f.name).write_bytes(f.read_bytes())
    config = json.loads((bad_rank / "adapter_config.json").read_text())
    (bad_rank / "adapter_config.json").write_text(json.dumps({**config, "r": 8}))
    with pytest.raises(ValueError, match=r"declares rank 8"):
        engine.add_lora("bad_rank", str(bad_rank))

    big = save_lora(base, tmp_path / "big", "BertModel", seed=7, r=16,
                    target_modules=["query"])
    with pytest.raises(ValueError, match=r"rank 16, above max_lora_rank=8"):
        engine.add_lora("big", str(big))

    distil = save_distilbert(tmp_path / "distil", "base", seed=8)
    distil_adapter = save_lora(distil, tmp_path / "distil_lora", "DistilBertModel", seed=9,
                               r=2, target_modules=["q_lin"])
    with pytest.raises(ValueError, match=r"does not have"):
        engine.add_lora("distil", str(distil_adapter))

    dora = tmp_path / "dora"
    dora.mkdir()
    for f in adapters["all"].iterdir():
        (dora / f.name).write_bytes(f.read_bytes())
    (dora / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}))
    with pytest.raises(ValueError, match="use_dora"):
        engine.add_lora("dora", str(dora))

    assert engine.lora_names == ["all"]
    after = np.stack([o.embedding for o in engine.embed(TEXTS, lora="all")])
    np.testing.assert_array_equal(before, after)


def test_non_lora_family_is_refused(tmp_path):
    from tests.models.tiny_task_models import save_decoder_model

    folder = save_decoder_model(tmp_path / "llama", "llama", "base")
    with pytest.raises(ValueError, match="families"):
        Engine(str(folder), enable_lora=True)


# ---- classify: RoBERTa (classifier saved whole) and BERT (LoRA on the classifier) -------
@pytest.mark.parametrize("family", ["roberta", "bert"])
def test_classify_adapters_equal_merged(family, tmp_path):
    if family == "roberta":
        base = save_roberta_seq_model(tmp_path / "base", num_labels=3, seed=11)
        cls_name = "RobertaForSequenceClassification"
        kinds = {"a": dict(task_type="SEQ_CLS", r=4, lora_alpha=8,
                           target_modules=["query", "value", "dense"]),
                 "b": dict(task_type="SEQ_CLS", r=2, target_modules=["key"])}
    else:
        base = save_bert_task_model(tmp_path / "base", "seq", num_labels=3, seed=11)
        cls_name = "BertForSequenceClassification"
        kinds = {"a": dict(r=4, lora_alpha=8, target_modules=["query", "value", "classifier"]),
                 "b": dict(r=2, target_modules=["key", "dense"])}
    adapters = {n: save_lora(base, tmp_path / n, cls_name, seed=12 + i, **kw)
                for i, (n, kw) in enumerate(kinds.items())}
    refs = {None: np.stack(hf_outputs(base, cls_name, TEXTS))}  # [texts, num_labels] logits
    for name, path in adapters.items():
        merged = save_merged(base, path, tmp_path / f"merged_{name}", cls_name)
        refs[name] = np.stack(hf_outputs(merged, cls_name, TEXTS))
        assert np.abs(refs[name] - refs[None]).max() > 1e-2
    engine = Engine(str(base), lora_modules={k: str(v) for k, v in adapters.items()})
    for name in (None, "a", "b"):
        ours = np.stack([o.probs for o in engine.classify(TEXTS, use_activation=False,
                                                          lora=name)])
        np.testing.assert_allclose(ours, refs[name], atol=ATOL, err_msg=str(name))
    loras = ["a", None, "b", "b", "a", None]
    outputs, steps = _mixed_run(engine, "classify", TEXTS, loras, use_activation=False)
    assert steps == 1
    for i, (out, lora) in enumerate(zip(outputs, loras)):
        np.testing.assert_allclose(out, refs[lora][i], atol=ATOL, err_msg=f"text {i} {lora}")


# ---- ModernBERT token_classify (fused Wqkv targeted whole, head dense, classifier saved) --
def test_modernbert_token_classify_adapters_equal_merged(tmp_path):
    cls_name = "ModernBertForTokenClassification"
    base = tmp_path / "base"
    build_modernbert(base, cls_name, seed=21)
    adapters = {
        "a": save_lora(base, tmp_path / "a", cls_name, seed=22, task_type="TOKEN_CLS", r=4,
                       lora_alpha=8, target_modules=["Wqkv", "Wo", "Wi", "dense"]),
        "b": save_lora(base, tmp_path / "b", cls_name, seed=23, r=2,
                       target_modules=["Wqkv", "classifier"]),
    }
    texts = MODERNBERT_TEXTS
    refs = {None: hf_outputs(base, cls_name, texts)}
    for name, path in adapters.items():
        refs[name] = hf_outputs(save_merged(base, path, tmp_path / f"m_{name}", cls_name),
                                cls_name, texts)
        assert max(np.abs(r - b).max() for r, b in zip(refs[name], refs[None])) > 1e-2
    engine = Engine(str(base), lora_modules={k: str(v) for k, v in adapters.items()})
    for name in (None, "a", "b"):
        for i, out in enumerate(engine.token_classify(texts, use_activation=False, lora=name)):
            np.testing.assert_allclose(out.probs, refs[name][i], atol=ATOL,
                                       err_msg=f"{name} text {i}")
    loras = ["b", "a", None, "a", "b"]
    outputs, steps = _mixed_run(engine, "token_classify", texts, loras, use_activation=False)
    assert steps == 1
    for i, (out, lora) in enumerate(zip(outputs, loras)):
        np.testing.assert_allclose(out, refs[lora][i], atol=ATOL, err_msg=f"text {i} {lora}")


def test_int8_layers_take_adapters(bert_embed):
    """quantization='int8' swaps the FFN and output projections for int8 layers (no oneDNN
    fast path): adapters still reach them, through the layer's forward hook."""
    base, adapters, refs = bert_embed
    # precision_check="off": int8 even where the load-time check would find it slower
    engine = Engine(str(base), quantization="int8", precision_check="off",
                    lora_modules={"all": str(adapters["all"])})
    up_proj = engine.core.model_runner.model.backbone.layers[0].up_proj
    assert type(up_proj).__name__ == "Int8Linear" and up_proj._forward_hooks
    ours = np.stack([o.embedding for o in engine.embed(TEXTS, lora="all", normalize=True)])
    ref = refs["all"] / np.linalg.norm(refs["all"], axis=1, keepdims=True)
    cosine = (ours * ref).sum(1)
    assert cosine.min() > 0.99
    base_out = np.stack([o.embedding for o in engine.embed(TEXTS, normalize=True)])
    assert np.abs(base_out - ours).max() > 1e-2


# ---- DistilBERT, MPNet and ELECTRA embed (their layers are BERT's, under other names) -------------
@pytest.mark.parametrize("family", ["distilbert", "mpnet", "electra"])
def test_embed_other_bert_layouts(family, tmp_path):
    if family == "electra":  # embeddings narrower than the encoder (embeddings_project)
        base = save_electra(tmp_path / "base", "base", seed=31)
        cls_name, targets = "ElectraModel", ["query", "key", "value", "dense"]
    elif family == "distilbert":
        base = save_distilbert(tmp_path / "base", "base", seed=31)
        cls_name, targets = "DistilBertModel", ["q_lin", "k_lin", "v_lin", "out_lin", "lin1",
                                                "lin2"]
    else:
        base = save_mpnet(tmp_path / "base", "base", seed=31)
        cls_name, targets = "MPNetModel", ["q", "k", "v", "o", "dense"]
    adapter = save_lora(base, tmp_path / "a", cls_name, seed=32, r=4, lora_alpha=8,
                        target_modules=targets)
    merged = save_merged(base, adapter, tmp_path / "merged", cls_name)
    ref = hf_outputs(merged, cls_name, TEXTS)
    engine = Engine(str(base), lora_modules={"a": str(adapter)})
    loras = ["a", None, "a", None, "a", "a"]
    base_ref = hf_outputs(base, cls_name, TEXTS)
    assert max(np.abs(r - b).max() for r, b in zip(ref, base_ref)) > 1e-2
    outputs = engine.token_embed(TEXTS, normalize=False, lora="a")
    for i, out in enumerate(outputs):
        np.testing.assert_allclose(out.embeddings, ref[i], atol=ATOL, err_msg=f"text {i}")
    mixed, steps = _mixed_run(engine, "token_embed", TEXTS, loras, normalize=False)
    assert steps == 1
    for i, (out, lora) in enumerate(zip(mixed, loras)):
        expected = ref[i] if lora else base_ref[i]
        np.testing.assert_allclose(out, expected, atol=ATOL, err_msg=f"text {i} {lora}")


def test_bf16_layers_take_adapters(bert_embed):
    """dtype='bfloat16' on the CPU swaps the backbone's linears for bf16 GEMM layers: a step
    with adapters runs their layers in fp32 with the updates added (never silently without)."""
    from pooler.layers.linear import BF16_ONEDNN

    if not BF16_ONEDNN:
        pytest.skip("no oneDNN bf16 GEMM on this CPU")
    base, adapters, refs = bert_embed
    engine = Engine(str(base), dtype="bfloat16", precision_check="off",
                    lora_modules={"all": str(adapters["all"])})
    kinds = {type(m).__name__ for m in engine.core.model_runner.model.backbone.modules()}
    assert "Bf16Linear" in kinds
    ours = np.stack([o.embedding for o in engine.embed(TEXTS, lora="all", normalize=True)])
    ref = refs["all"] / np.linalg.norm(refs["all"], axis=1, keepdims=True)
    assert (ours * ref).sum(1).min() > 0.999
    base_out = np.stack([o.embedding for o in engine.embed(TEXTS, normalize=True)])
    assert np.abs(base_out - ours).max() > 1e-2
