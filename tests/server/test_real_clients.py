"""The client libraries users already run, each against a live pooler server on 127.0.0.1,
getting the offline Engine's numbers (max abs difference 1e-5)."""
from __future__ import annotations

import logging

import httpx
import numpy as np
import pytest


TEXTS = ["pooler serves embedding models", "The cat sat on the mat.", "A feline rested."]
ATOL = 1e-5


def expected(engine, texts=TEXTS, **kwargs) -> np.ndarray:
    return np.stack([o.embedding for o in engine.embed(texts, **kwargs)])  # [n, 384]


@pytest.fixture(scope="module")
def served_name(server) -> str:
    return server[1].state.pooler.model_name


@pytest.fixture(scope="module")
def classifier(classifier_server):
    return classifier_server[:2]


@pytest.fixture(scope="module")
def reranker(cross_encoder_server):
    return cross_encoder_server[:2]


@pytest.fixture(scope="module")
def token_classifier(token_classifier_server):
    return token_classifier_server[:2]


# ---- OpenAI-style clients -------------------------------------------------------------------
def test_openai_client(url, engine, served_name):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    for encoding in ("float", "base64"):  # the client asks for base64 unless told otherwise
        kwargs = {"encoding_format": encoding} if encoding == "float" else {}
        response = client.embeddings.create(model=served_name, input=TEXTS, **kwargs)
        got = np.array([d.embedding for d in response.data], np.float32)
        np.testing.assert_allclose(got, expected(engine), atol=ATOL)
    response = client.embeddings.create(model=served_name, input=TEXTS[0], dimensions=64)
    np.testing.assert_allclose(response.data[0].embedding,
                               expected(engine, TEXTS[:1], dimensions=64)[0], atol=ATOL)


def test_langchain_openai_embeddings(url, engine, served_name):
    lc = pytest.importorskip("langchain_openai")
    embeddings = lc.OpenAIEmbeddings(model=served_name, base_url=f"{url}/v1",
                                     api_key="unused", check_embedding_ctx_length=False)
    np.testing.assert_allclose(embeddings.embed_documents(TEXTS), expected(engine), atol=ATOL)
    np.testing.assert_allclose(embeddings.embed_query(TEXTS[1]), expected(engine)[1], atol=ATOL)


def test_llama_index_openai_like_embedding(url, engine, served_name):
    mod = pytest.importorskip("llama_index.embeddings.openai_like")
    embed_model = mod.OpenAILikeEmbedding(model_name=served_name, api_base=f"{url}/v1",
                                          api_key="unused")
    got = embed_model.get_text_embedding_batch(TEXTS)
    np.testing.assert_allclose(got, expected(engine), atol=ATOL)


# ---- TEI clients ----------------------------------------------------------------------------
def test_llama_index_text_embeddings_inference(url, engine):
    mod = pytest.importorskip("llama_index.embeddings.text_embeddings_inference")
    embed_model = mod.TextEmbeddingsInference(model_name="any-name", base_url=url)
    np.testing.assert_allclose(embed_model.get_text_embedding_batch(TEXTS), expected(engine),
                               atol=ATOL)
    np.testing.assert_allclose(embed_model.get_query_embedding(TEXTS[0]), expected(engine)[0],
                               atol=ATOL)


# tei-client's generated stubs and pooler's own (pooler/server/grpc/generated/tei_pb2.py,
# imported by the gRPC tests in this process) both register the tei.v1 symbols in protobuf's
# process-wide descriptor pool, which refuses the second set: the client runs in its own
# interpreter, as a user's client process would, and reports what it got as JSON.
_TEI_CLIENT_SCRIPT = """
import json, sys
import tei_client
url, cls_url, ce_url, texts = json.loads(sys.argv[1])
client = tei_client.HttpClient(url)
info = client.info()
ids = [t.id for t in client.tokenize("hello world")[0].tokens]
result = tei_client.HttpClient(cls_url).classify("great movie")
scores = result[0].scores if isinstance(result, list) else result.scores
ranks = tei_client.HttpClient(ce_url).rerank("where is Paris?", ["Paris is in France.",
                                                                 "Cats sleep."])
print(json.dumps({
    "health": bool(client.health()),
    "embedding_type": info.server_model_type == tei_client.ModelType.Embedding,
    "max_input_length": info.max_input_length,
    "embed": [list(map(float, v)) for v in client.embed(texts)],
    "ids": ids, "decoded": client.decode(ids), "prompt_names": client.prompt_names(),
    "top": [scores[0].label, float(scores[0].score)],
    "ranks": {str(r.index): float(r.score) for r in ranks.ranks}}))
"""


def test_tei_client_package(url, engine, classifier, reranker):
    import json
    import subprocess
    import sys

    import importlib.util

    if importlib.util.find_spec("tei_client") is None:  # not imported here (see above)
        pytest.skip("tei-client is not installed")
    (cls_url, cls_engine), (ce_url, ce_engine) = classifier, reranker
    done = subprocess.run([sys.executable, "-c", _TEI_CLIENT_SCRIPT,
                           json.dumps([url, cls_url, ce_url, TEXTS])],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout)
    assert got["health"] and got["embedding_type"]
    assert got["max_input_length"] == engine.model_config.max_model_len
    np.testing.assert_allclose(got["embed"], expected(engine), atol=ATOL)
    assert got["ids"] == engine.tokenizer.encode_batch(["hello world"])[0].input_ids
    assert got["decoded"] == ["hello world"]
    assert got["prompt_names"] == []  # MiniLM declares none; TEI's error message says so
    top = cls_engine.classify("great movie")[0]
    assert got["top"][0] == top.label
    np.testing.assert_allclose(got["top"][1], top.score, atol=ATOL)
    want = {r.index: r.score for r in ce_engine.rerank("where is Paris?",
                                                       ["Paris is in France.", "Cats sleep."])}
    for index, score in got["ranks"].items():
        np.testing.assert_allclose(score, want[int(index)], atol=ATOL)
    assert len(got["ranks"]) == 2


def test_huggingface_hub_inference_client(url, engine, st_minilm, classifier,
                                          token_classifier, monkeypatch):
    hub = pytest.importorskip("huggingface_hub")
    # The suite runs with HF_HUB_OFFLINE=1, which blocks every request of the client, even to
    # 127.0.0.1; these go to the local test server only.
    monkeypatch.setattr(hub.constants, "is_offline_mode", lambda: False)
    client = hub.InferenceClient(model=url)
    got = client.feature_extraction(TEXTS[0])
    np.testing.assert_allclose(np.asarray(got).reshape(-1), expected(engine)[0], atol=ATOL)
    sims = client.sentence_similarity(TEXTS[0], other_sentences=TEXTS[1:])
    vectors = st_minilm.encode(TEXTS, convert_to_tensor=True)
    np.testing.assert_allclose(sims, st_minilm.similarity(vectors[:1], vectors[1:])[0].numpy(),
                               atol=ATOL)

    cls_url, cls_engine = classifier
    labels = hub.InferenceClient(model=cls_url).text_classification("great movie")
    want = cls_engine.classify("great movie")[0].labels
    assert [x.label for x in labels] == [w["label"] for w in want]
    np.testing.assert_allclose([x.score for x in labels], [w["score"] for w in want], atol=ATOL)
    top1 = hub.InferenceClient(model=cls_url).text_classification("great movie", top_k=1)
    assert len(top1) == 1 and top1[0].label == want[0]["label"]

    ner_url, ner_engine = token_classifier
    text = "Ada Lovelace lived in London"
    entities = hub.InferenceClient(model=ner_url).token_classification(text)
    want = ner_engine.ner(text)[0]
    assert [(e.entity_group, e.word, e.start, e.end) for e in entities] == \
        [(w.entity_group, w.word, w.start, w.end) for w in want]
    np.testing.assert_allclose([e.score for e in entities], [w.score for w in want], atol=ATOL)


# ---- Cohere -------------------------------------------------------------------------------------
def test_cohere_v2_embed_every_embedding_type(url, engine):
    cohere = pytest.importorskip("cohere")
    from pooler.server.dialects.quantized import quantize

    client = cohere.ClientV2(api_key="unused", base_url=url)
    response = client.embed(texts=TEXTS, model="embed-english-v3.0",
                            input_type="search_document",
                            embedding_types=["float", "int8", "uint8", "binary", "ubinary",
                                             "base64"])
    floats = expected(engine)
    np.testing.assert_allclose(response.embeddings.float_, floats, atol=ATOL)
    for kind in ("int8", "uint8", "binary", "ubinary"):
        got = np.array(getattr(response.embeddings, kind))
        want = quantize(floats, kind).astype(int)
        # a float difference of 1e-7 can only move a value sitting on a bucket edge
        assert np.abs(got - want).max() <= 1, kind
        assert got.shape == want.shape
    import base64
    decoded = np.stack([np.frombuffer(base64.b64decode(s), "<f4")
                        for s in response.embeddings.base64])
    np.testing.assert_allclose(decoded, floats, atol=ATOL)
    assert response.texts == TEXTS


def test_cohere_v1_embed(url, engine):
    cohere = pytest.importorskip("cohere")
    client = cohere.Client(api_key="unused", base_url=url)
    plain = client.embed(texts=TEXTS, model="embed-english-v3.0", input_type="search_query")
    assert plain.response_type == "embeddings_floats"
    np.testing.assert_allclose(plain.embeddings, expected(engine), atol=ATOL)
    typed = client.embed(texts=TEXTS, model="any", input_type="search_query",
                         embedding_types=["float", "ubinary"])
    np.testing.assert_allclose(typed.embeddings.float_, expected(engine), atol=ATOL)
    assert np.array(typed.embeddings.ubinary).shape == (3, 48)
    # A Cohere v1 body on TEI's /embed path is answered as Cohere's
    body = httpx.post(f"{url}/embed", json={"texts": TEXTS[:1], "model": "x"}, timeout=60).json()
    np.testing.assert_allclose(body["embeddings"], expected(engine, TEXTS[:1]), atol=ATOL)


def test_cohere_errors_and_truncate(url, engine):
    cohere = pytest.importorskip("cohere")
    client = cohere.ClientV2(api_key="unused", base_url=url)
    long_text = "word " * 600
    with pytest.raises(cohere.errors.BadRequestError):
        client.embed(texts=[long_text], model="m", input_type="search_query",
                     embedding_types=["float"], truncate="NONE")
    for truncate, direction in (("END", "right"), ("START", "left")):
        got = client.embed(texts=[long_text + "end"], model="m", input_type="search_query",
                           embedding_types=["float"], truncate=truncate).embeddings.float_
        np.testing.assert_allclose(got, expected(engine, [long_text + "end"],
                                                 truncation_direction=direction), atol=ATOL)
    r = httpx.post(f"{url}/v2/embed", json={"texts": [], "model": "m"}, timeout=60)
    assert r.status_code == 400 and "texts" in r.json()["message"]
    r = httpx.post(f"{url}/v2/embed", json={"texts": ["a"], "embedding_types": ["int4"]},
                   timeout=60)
    assert r.status_code == 400 and "embedding_types" in r.json()["message"]
