"""The pooled-rows route (pooler/worker/pooled_rows.py): a step whose pooling reads one row per
sequence computes the last layer on those rows alone. Engine outputs with the route equal the
outputs without it (1e-5) for BERT, XLM-R, DistilBERT, ELECTRA, GTE, NomicBert, EuroBERT,
ModernBERT (global and local last layers), DeBERTa v1/v2/v3 and decoder tiny models (embed with
CLS or last-token pooling, classify), single texts and mixed-length batches; a
forward hook shows the last layer's MLP saw one row per text, and that mean pooling,
token_embed and the switch POOLER_PRUNE_LAST_LAYER=0 keep every row."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from pooler import Engine
from pooler.worker.pooled_rows import PRUNE_ENV
from pooler.worker.step_paths import POOLED_ROWS
from tests.models.tiny import add_st_pooling, save_tiny_bert
from tests.models.tiny_task_models import (minilm_path, save_bert_task_model,
                                           save_roberta_seq_model)

ATOL = 1e-5
TEXTS = ["hi", "the quick brown fox jumps over the lazy dog and keeps running far away",
         "what is the capital of france", "a cat sat on the mat while the dog slept"]
PAIRS = ["a greeting", "foxes are quick animals", "paris", "cats and dogs"]


def _runner(engine: Engine):
    return engine.core.model_runner


def _last_mlp_norm(engine: Engine):
    """The norm at the backbone's last layer's MLP: it sees the rows the layer computed."""
    layer = _runner(engine).model.backbone.layers[-1]
    norm = getattr(layer, "mlp_norm", None)
    return norm if norm is not None else layer.post_attention_layernorm  # decoders


def _rows_seen(engine: Engine, call) -> list[int]:
    seen: list[int] = []
    handle = _last_mlp_norm(engine).register_forward_hook(
        lambda module, args, out: seen.append(args[0].shape[0]))
    try:
        call()
    finally:
        handle.remove()
    return seen


def _pruned_and_full(engine: Engine, call):
    """call() with the route on, then off (the same engine)."""
    runner = _runner(engine)
    assert runner.prune_last_layer, "the backbone should declare prunes_last_layer"
    pruned = call()
    runner.prune_last_layer = False
    try:
        full = call()
    finally:
        runner.prune_last_layer = True
    return pruned, full


def _assert_embeddings_equal(engine: Engine, texts, **kwargs):
    def call():
        return np.stack([o.embedding for o in engine.embed(texts, **kwargs)])
    pruned, full = _pruned_and_full(engine, call)
    np.testing.assert_allclose(pruned, full, atol=ATOL)
    assert np.abs(full).max() > 1e-3  # not all zeros


def _assert_probs_equal(engine: Engine, texts, pairs=None):
    def call():
        outputs = engine.classify(texts, text_pair=pairs, use_activation=False)
        return np.stack([o.probs for o in outputs])
    pruned, full = _pruned_and_full(engine, call)
    np.testing.assert_allclose(pruned, full, atol=ATOL)


@pytest.fixture(scope="module")
def bert_cls(tmp_path_factory):
    folder = save_tiny_bert(tmp_path_factory.mktemp("bert_cls"), minilm_path(), seed=3,
                            initializer_range=0.4)  # outputs far from uniform attention
    add_st_pooling(folder, "cls", normalize=True)
    return folder


@pytest.fixture(scope="module")
def bert_engine(bert_cls):
    return Engine(str(bert_cls), device="cpu")


def test_bert_cls_embed_equal_and_pruned(bert_engine):
    for texts in (TEXTS[1], TEXTS):  # one text, a mixed-length batch
        _assert_embeddings_equal(bert_engine, texts)
    # the last layer's MLP (its closing norm) saw one row per text, not every token
    seen = _rows_seen(bert_engine, lambda: bert_engine.embed(TEXTS))
    assert seen == [len(TEXTS)]
    _runner(bert_engine).prune_last_layer = False
    try:
        seen = _rows_seen(bert_engine, lambda: bert_engine.embed(TEXTS))
    finally:
        _runner(bert_engine).prune_last_layer = True
    assert seen and seen[0] > len(TEXTS) * 3


def test_mean_pooling_and_token_tasks_keep_every_row(bert_cls, bert_engine, tmp_path):
    mean = shutil.copytree(bert_cls, tmp_path / "mean")
    add_st_pooling(mean, "mean")
    engine = Engine(str(mean), device="cpu")
    num_tokens = sum(o.num_tokens for o in engine.embed(TEXTS))
    assert _rows_seen(engine, lambda: engine.embed(TEXTS)) == [num_tokens]
    token = _rows_seen(bert_engine, lambda: bert_engine.token_embed(TEXTS))
    assert token == [num_tokens]


def test_switch_off_by_environment(bert_cls, monkeypatch):
    monkeypatch.setenv(PRUNE_ENV, "0")
    engine = Engine(str(bert_cls), device="cpu")
    assert not _runner(engine).prune_last_layer
    seen = _rows_seen(engine, lambda: engine.embed(TEXTS))
    assert seen and seen[0] > len(TEXTS)


def test_bert_classify_equal_and_pruned(tmp_path):
    folder = save_bert_task_model(tmp_path / "seq", "seq", num_labels=3)
    engine = Engine(str(folder), device="cpu")
    _assert_probs_equal(engine, TEXTS)
    _assert_probs_equal(engine, TEXTS, PAIRS)  # sentence pairs, two token types
    seen = _rows_seen(engine, lambda: engine.classify(TEXTS))
    assert seen == [len(TEXTS)]


def test_xlm_roberta_embed_and_classify(tmp_path):
    folder = save_tiny_bert(tmp_path / "xlmr", minilm_path(), kind="xlm-roberta", seed=5,
                            initializer_range=0.4)
    add_st_pooling(folder, "cls")
    _assert_embeddings_equal(Engine(str(folder), device="cpu"), TEXTS)
    seq = save_roberta_seq_model(tmp_path / "xlmr_seq", num_labels=2, seed=6, xlm=True)
    engine = Engine(str(seq), device="cpu")
    _assert_probs_equal(engine, TEXTS, PAIRS)
    assert _rows_seen(engine, lambda: engine.classify(TEXTS)) == [len(TEXTS)]


@pytest.mark.parametrize("family", ["gte", "nomic_bert", "eurobert"])
def test_rotary_encoders_embed_and_classify(family, tmp_path):
    from tests.models.rotary_folders import build_family, require_family

    require_family(family)
    folder = tmp_path / "base"
    build_family(folder, family)
    add_st_pooling(folder, "cls")
    engine = Engine(str(folder), device="cpu", runner="native")
    for texts in (TEXTS[1], TEXTS):
        _assert_embeddings_equal(engine, texts)
    assert _rows_seen(engine, lambda: engine.embed(TEXTS)) == [len(TEXTS)]
    if family == "eurobert":  # its classifier pools "late" (every token) by default
        return
    require_family(family, "ForSequenceClassification")
    seq = tmp_path / "seq"
    build_family(seq, family, "ForSequenceClassification", seed=1)
    engine = Engine(str(seq), device="cpu", runner="native")
    _assert_probs_equal(engine, TEXTS)
    assert _rows_seen(engine, lambda: engine.classify(TEXTS)) == [len(TEXTS)]


@pytest.mark.parametrize("family", ["distilbert", "electra"])
def test_distilbert_and_electra_classify(family, tmp_path):
    from tests.models import encoder_folders

    save = getattr(encoder_folders, f"save_{family}")
    engine = Engine(str(save(tmp_path / family, "seq", seed=2)), device="cpu")
    _assert_probs_equal(engine, TEXTS)
    assert _rows_seen(engine, lambda: engine.classify(TEXTS)) == [len(TEXTS)]


@pytest.mark.parametrize("dtype,quantization", [("bfloat16", None), ("float32", "int8")])
def test_bf16_and_int8_engines(bert_cls, bert_engine, dtype, quantization, monkeypatch):
    """Their last layer on the rows takes q/k/v rounded as the full layer's are; what differs
    is where bf16 results round (oneDNN's accumulation order depends on the row count): 2e-3
    here, where the bf16 engine is 8e-3 from fp32; int8: 6e-8. Each stays as close to fp32."""
    engine = Engine(str(bert_cls), device="cpu", dtype=dtype, quantization=quantization,
                    precision_check="off")

    def call():
        return np.stack([o.embedding for o in engine.embed(TEXTS)])
    pruned, full = _pruned_and_full(engine, call)
    fp32 = np.stack([o.embedding for o in bert_engine.embed(TEXTS)])
    np.testing.assert_allclose(pruned, full, atol=5e-3)

    def cosine(a, b):  # normalized embeddings
        return (a * b).sum(-1)
    assert cosine(pruned, fp32).min() >= cosine(full, fp32).min() - 1e-4
    # the int8 layers norm in their GEMM's epilogue (no module call to hook): count the
    # query rows of the last layer's attention instead
    from pooler.models import bert

    queries, real = [], bert.attention_for_rows
    monkeypatch.setattr(bert, "attention_for_rows",
                        lambda q, *a, **k: queries.append(q.shape[0]) or real(q, *a, **k))
    call()
    assert queries == [len(TEXTS)]


@pytest.mark.parametrize("family,window", [("llama", None), ("qwen3", None), ("mistral", 3)])
def test_decoders_last_token_embed_and_classify(family, window, tmp_path):
    """Causal attention from each pooled row's own position: the last token for embed, the
    last non-pad token for classify (a text ending in the pad id pools an earlier row), within
    Mistral's sliding window."""
    from tests.models.tiny_task_models import random_ids, save_decoder_model

    extra = {} if window is None else {"sliding_window": window}
    ids = random_ids([3, 9, 1, 12], 97, seed=4)
    engine = Engine(str(save_decoder_model(tmp_path / "causal", family, "causal", **extra)))

    def embed():
        return np.stack([o.embedding for o in engine.embed(ids, normalize=False)])
    pruned, full = _pruned_and_full(engine, embed)
    np.testing.assert_allclose(pruned, full, atol=ATOL)
    assert _rows_seen(engine, embed) == [len(ids)]
    engine = Engine(str(save_decoder_model(tmp_path / "seq", family, "seq", num_labels=3,
                                           **extra)))
    ids = ids + [[5, 6, 7, 8, 9, 0, 0]]  # ends in the pad id: token 9 (row 4 of 7) is read

    def classify():
        return np.stack([o.probs for o in engine.classify(ids, use_activation=False)])
    pruned, full = _pruned_and_full(engine, classify)
    np.testing.assert_allclose(pruned, full, atol=ATOL)
    assert _rows_seen(engine, classify) == [len(ids)]


@pytest.mark.parametrize("num_layers,last", [(4, "full_attention"), (3, "sliding_attention")])
def test_modernbert_embed_global_and_local_last_layer(num_layers, last, tmp_path):
    """CLS and last-token embeddings; the tiny model's layers are global every third from 0, so
    3 layers end on a local one (local_attention=8: 4 keys each side), and the test texts run
    far past that window (the CLS row sees the first 5 keys, the last token its last 5)."""
    from tests.models.modernbert_folders import TEXTS as MB_TEXTS, build_modernbert

    model = build_modernbert(tmp_path / "mb", num_hidden_layers=num_layers)
    assert model.config.layer_types[-1] == last
    for mode in ("cls", "lasttoken"):
        folder = shutil.copytree(tmp_path / "mb", tmp_path / mode)
        add_st_pooling(folder, mode)
        engine = Engine(str(folder), device="cpu")
        lengths = [o.num_tokens for o in engine.embed(MB_TEXTS)]
        assert max(lengths) > 3 * 8
        for texts in (MB_TEXTS[1], MB_TEXTS):  # one text, a mixed-length batch
            _assert_embeddings_equal(engine, texts, normalize=False)
        assert _rows_seen(engine, lambda: engine.embed(MB_TEXTS)) == [len(MB_TEXTS)]


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_modernbert_classify_cls_pruned_mean_not(pooling, tmp_path):
    from tests.models.modernbert_folders import TEXTS as MB_TEXTS, build_modernbert

    build_modernbert(tmp_path, "ModernBertForSequenceClassification", seed=1,
                     classifier_pooling=pooling)
    engine = Engine(str(tmp_path), device="cpu")
    _assert_probs_equal(engine, MB_TEXTS)
    _assert_probs_equal(engine, MB_TEXTS[:3], MB_TEXTS[2:])  # sentence pairs
    seen = _rows_seen(engine, lambda: engine.classify(MB_TEXTS))
    assert (POOLED_ROWS in engine.step_paths()) == (pooling == "cls")
    if pooling == "cls":
        assert seen == [len(MB_TEXTS)]
    else:  # mean pooling reads every token: the last layer computes them all
        assert seen == [sum(o.num_tokens for o in engine.classify(MB_TEXTS))]


@pytest.mark.parametrize("version", ["v3", "v2", "v1"])
def test_deberta_classify_equal_and_pruned(version, tmp_path):
    """Cross-encoders reading [CLS] through ContextPooler: single texts and sentence pairs of
    mixed lengths, past the tiny table's log buckets and its clamp (deberta_folders)."""
    from tests.models.deberta_folders import TEXTS as DB_TEXTS, V1, V2, V3, build_deberta

    style = {"v3": V3, "v2": V2, "v1": V1}[version]
    prefix = "Deberta" if version == "v1" else "DebertaV2"
    build_deberta(tmp_path, prefix + "ForSequenceClassification", seed=6, style=style,
                  initializer_range=0.2)  # logits far apart: a wrong term shows
    engine = Engine(str(tmp_path), device="cpu")
    _assert_probs_equal(engine, DB_TEXTS[3])  # one long text alone
    _assert_probs_equal(engine, DB_TEXTS)
    _assert_probs_equal(engine, DB_TEXTS, DB_TEXTS[::-1])  # pairs, both long and short
    assert _rows_seen(engine, lambda: engine.classify(DB_TEXTS)) == [len(DB_TEXTS)]


def test_deberta_last_token_rows_read_their_own_positions(tmp_path):
    """Last-token embeddings: each row's c2p and p2c terms come from row p > 0 of the index
    tables (the CLS tests only read row 0)."""
    from tests.models.deberta_folders import TEXTS as DB_TEXTS, build_deberta

    build_deberta(tmp_path, "DebertaV2Model", seed=7, initializer_range=0.2)
    add_st_pooling(tmp_path, "lasttoken")
    engine = Engine(str(tmp_path), device="cpu")
    for texts in (DB_TEXTS[3], DB_TEXTS):
        _assert_embeddings_equal(engine, texts, normalize=False)
    assert _rows_seen(engine, lambda: engine.embed(DB_TEXTS)) == [len(DB_TEXTS)]


@pytest.mark.parametrize("family", ["modernbert", "deberta"])
def test_modernbert_and_deberta_int8_engines(family, tmp_path):
    """int8 engines take the route too (q/k/v rounded as the full layer's, attend_rows);
    ModernBERT's full layer multiplies the attention weights by V in bf16 there (the bf16
    products kernel), the rows' attention in fp32: 5e-4 apart here, each as close to fp32."""
    if family == "modernbert":
        from tests.models.modernbert_folders import TEXTS as texts, build_modernbert

        build_modernbert(tmp_path, num_hidden_layers=3)
        add_st_pooling(tmp_path, "cls")

        def call(engine):
            return np.stack([o.embedding for o in engine.embed(texts, normalize=False)])
    else:
        from tests.models.deberta_folders import TEXTS as texts, build_deberta

        build_deberta(tmp_path, "DebertaV2ForSequenceClassification", seed=6,
                      initializer_range=0.2)

        def call(engine):
            return np.stack([o.probs for o in engine.classify(texts, use_activation=False)])
    fp32 = call(Engine(str(tmp_path), device="cpu"))
    engine = Engine(str(tmp_path), device="cpu", quantization="int8", precision_check="off")
    pruned, full = _pruned_and_full(engine, lambda: call(engine))
    np.testing.assert_allclose(pruned, full, atol=2e-3)
    assert np.abs(pruned - fp32).max() <= 1.5 * np.abs(full - fp32).max() + 1e-6
    assert _rows_seen(engine, lambda: call(engine)) == [len(texts)]
