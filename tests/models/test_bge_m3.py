"""BGE-M3 (XLM-R + colbert_linear.pt + sparse_linear.pt): dense, sparse and ColBERT from one
forward pass, against FlagEmbedding's BGEM3FlagModel on a seeded tiny XLM-R saved in BGE-M3's
layout (sentence-transformers folder with CLS pooling + Normalize, the two head files)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.models.flag_embedding import bge_m3_flag_model_class
from tests.models.tiny import add_st_pooling
from tests.models.tiny_task_models import CORPUS

TEXTS = ["what is the capital of france", "paris is the capital of france",
         "a cat sat on the mat and the quick brown fox jumps over the lazy dog", "berlin"]
QUERY = "what is the capital of france"
WEIGHTS = [0.4, 0.2, 0.4]  # the BGE-M3 model card's


def save_bge_m3(dest):
    from tokenizers import ByteLevelBPETokenizer, processors
    from transformers import PreTrainedTokenizerFast, XLMRobertaConfig, XLMRobertaModel

    dest.mkdir(parents=True)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS, vocab_size=300, min_frequency=1,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    bpe._tokenizer.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer, bos_token="<s>", eos_token="</s>", cls_token="<s>",
        sep_token="</s>", pad_token="<pad>", unk_token="<unk>", mask_token="<mask>",
        model_max_length=64)
    tokenizer.save_pretrained(dest)
    assert len(tokenizer("berlin is in germany")["input_ids"]) > 4
    torch.manual_seed(0)
    config = XLMRobertaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                              num_attention_heads=4, intermediate_size=64,
                              max_position_embeddings=66, type_vocab_size=1, pad_token_id=1,
                              bos_token_id=0, eos_token_id=2, initializer_range=0.4)
    model = XLMRobertaModel(config, add_pooling_layer=False).eval()
    model.save_pretrained(dest)
    # BGE-M3's heads: torch state dicts of Linear(hidden, hidden) and Linear(hidden, 1).
    torch.save(torch.nn.Linear(32, 32).state_dict(), dest / "colbert_linear.pt")
    sparse = torch.nn.Linear(32, 1)
    with torch.no_grad():  # centre the token weights: about half positive, half cut by relu
        hidden = model(**tokenizer(TEXTS, return_tensors="pt", padding=True)).last_hidden_state
        sparse.bias.sub_((hidden @ sparse.weight.T + sparse.bias).median())
    torch.save(sparse.state_dict(), dest / "sparse_linear.pt")
    add_st_pooling(dest, "cls", normalize=True)
    return dest


@pytest.fixture(scope="module")
def m3_path(tmp_path_factory):
    return save_bge_m3(tmp_path_factory.mktemp("m3") / "bge-m3-tiny")


@pytest.fixture(scope="module")
def reference(m3_path):
    BGEM3FlagModel = bge_m3_flag_model_class()
    return BGEM3FlagModel(str(m3_path), use_fp16=False, devices="cpu")


@pytest.fixture(scope="module")
def engine(m3_path):
    from pooler import Engine

    return Engine(str(m3_path))


def test_all_three_outputs_match_flagembedding(engine, reference):
    ref = reference.encode(TEXTS, batch_size=4, return_dense=True, return_sparse=True,
                           return_colbert_vecs=True)
    forwards = _count_forwards(engine)
    got = engine.embed_bge_m3(TEXTS)  # one mixed-length packed batch
    assert forwards() == 1  # dense, sparse and ColBERT from one forward pass
    for i, out in enumerate(got):
        np.testing.assert_allclose(out.dense, ref["dense_vecs"][i], atol=1e-5)
        expected = {int(k): float(v) for k, v in ref["lexical_weights"][i].items()}
        assert expected and set(out.sparse.to_dict()) == set(expected)
        for token_id, weight in out.sparse.to_dict().items():
            assert abs(weight - expected[token_id]) <= 1e-5
        assert out.colbert.shape == ref["colbert_vecs"][i].shape
        np.testing.assert_allclose(out.colbert, ref["colbert_vecs"][i], atol=1e-5)
    # special tokens (<s>, </s>, <pad>, <unk>) never carry lexical weight
    assert not {0, 1, 2, 3} & set(got[0].sparse.to_dict())
    # plain embed is the dense vector
    np.testing.assert_allclose(engine.embed(TEXTS)[2].embedding, ref["dense_vecs"][2], atol=1e-5)


def test_outputs_are_selectable_per_request(engine):
    full = engine.embed_bge_m3(TEXTS[:2])
    only_sparse = engine.embed_bge_m3(TEXTS[:2], outputs=["sparse"])
    assert only_sparse[0].dense is None and only_sparse[0].colbert is None
    assert only_sparse[1].sparse.to_dict() == full[1].sparse.to_dict()
    two = engine.embed_bge_m3(TEXTS[:2], outputs=("dense", "colbert"))
    assert two[0].sparse is None
    np.testing.assert_allclose(two[1].colbert, full[1].colbert, atol=1e-6)
    # different selections in one batch: each request gets its own
    from pooler.params import PoolingParams

    processed = engine.processor.process(TEXTS[:3])
    params = [engine.verify_params(PoolingParams(task="embed", extra={"bge_m3": o}))
              for o in (["dense"], ["colbert", "sparse"], None)]
    results = engine.run_processed(processed, params)
    assert set(results[0].data) == {"dense"} and set(results[1].data) == {"sparse", "colbert"}
    np.testing.assert_allclose(results[2].data.numpy(), engine.embed(TEXTS[2])[0].embedding,
                               atol=1e-6)
    with pytest.raises(ValueError, match="bge_m3 outputs must be a non-empty list"):
        engine.embed_bge_m3("x", outputs=["dense", "lexical"])


def test_compute_score_matches_flagembedding(engine, reference):
    docs = TEXTS[1:]
    # FlagEmbedding pads a batch's documents with zero vectors, which MaxSim can pick; one
    # pair per batch is its exact, unpadded score (pooler never pads).
    ref = reference.compute_score([[QUERY, d] for d in docs], batch_size=1,
                                  weights_for_different_modes=WEIGHTS)
    forwards = _count_forwards(engine)
    cache = engine.core.model_runner.pooling_runner.late_interaction
    got = engine.score_bge_m3(QUERY, docs, weights=WEIGHTS)
    # Two steps: the query (its three outputs cached), then every document scored against it
    # in the runner; the cache empties itself.
    assert forwards() == 2
    assert cache.num_cached_queries == 0 and cache.num_pending_docs == 0
    for mode in ("dense", "sparse", "colbert", "sparse+dense", "colbert+sparse+dense"):
        np.testing.assert_allclose([g.by_mode(mode) for g in got], ref[mode], atol=1e-5,
                                   err_msg=mode)
    default = reference.compute_score([[QUERY, d] for d in docs], batch_size=1)
    ranked = engine.rerank(QUERY, docs)  # default: colbert+sparse+dense, weights [1, 1, 1]
    expected = default["colbert+sparse+dense"]
    assert [r.index for r in ranked] == list(np.argsort(-np.array(expected), kind="stable"))
    np.testing.assert_allclose([r.score for r in sorted(ranked, key=lambda r: r.index)],
                               expected, atol=1e-5)
    sparse_only = engine.score(QUERY, docs, bge_m3_mode="sparse")
    np.testing.assert_allclose([s.score for s in sparse_only], default["sparse"], atol=1e-5)
    with pytest.raises(ValueError, match="bge_m3_mode must be one of"):
        engine.score(QUERY, docs, bge_m3_mode="hybrid")


def test_bge_m3_routes(engine, reference):
    import httpx

    from tests.server.conftest import serve

    ref = reference.encode(TEXTS[:2], return_dense=True, return_sparse=True,
                           return_colbert_vecs=True)
    scores = reference.compute_score([[QUERY, d] for d in TEXTS[1:3]], batch_size=1,
                                     weights_for_different_modes=WEIGHTS)
    with serve(engine) as (url, _), httpx.Client(base_url=url, timeout=60) as client:
        body = client.post("/bge_m3/embed", json={"input": TEXTS[:2]}).json()
        np.testing.assert_allclose(body["data"][1]["dense"], ref["dense_vecs"][1], atol=1e-5)
        assert {int(k) for k in body["data"][0]["sparse"]} == \
            {int(k) for k in ref["lexical_weights"][0]}
        np.testing.assert_allclose(body["data"][0]["colbert"], ref["colbert_vecs"][0], atol=1e-5)
        only = client.post("/bge_m3/embed", json={"input": "x", "outputs": ["sparse"]}).json()
        assert set(only["data"][0]) == {"index", "object", "sparse"}
        body = client.post("/bge_m3/score", json={"queries": QUERY, "documents": TEXTS[1:3],
                                                   "weights": WEIGHTS}).json()
        np.testing.assert_allclose([d["colbert+sparse+dense"] for d in body["data"]],
                                   scores["colbert+sparse+dense"], atol=1e-5)
        bad = client.post("/bge_m3/embed", json={"input": "x", "outputs": ["everything"]})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "outputs"
        bad = client.post("/bge_m3/score", json={"queries": "q", "documents": ["d"],
                                                  "weights": [1, 1]})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "weights"
        rerank = client.post("/v1/rerank", json={"query": QUERY, "documents": TEXTS[1:3]})
        assert rerank.status_code == 200


def _count_forwards(engine):
    backbone = engine.core.model_runner.model.backbone
    calls = []
    original = backbone.forward

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    backbone.forward = counting
    return lambda: (len(calls), setattr(backbone, "forward", original))[0]
