"""--grpc-port: TEI's tei.v1 API with the committed generated stubs as the client. Every RPC
(streaming included) against live servers of each model kind, numbers equal to the HTTP
routes, error statuses whose messages name the field, the API key from metadata, health and
reflection, and the stubs still generated from the .proto."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from pooler.server.settings import ServerSettings

grpc = pytest.importorskip("grpc")
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc  # noqa: E402

from pooler.server.grpc.generated import tei_pb2 as pb, tei_pb2_grpc as pb_grpc  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TOL = 1e-6


class Served:
    def __init__(self, url: str, app):
        self.http = httpx.Client(base_url=url, timeout=60)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{app.state.grpc_port}")
        self.info = pb_grpc.InfoStub(self.channel)
        self.embed = pb_grpc.EmbedStub(self.channel)
        self.predict = pb_grpc.PredictStub(self.channel)
        self.rerank = pb_grpc.RerankStub(self.channel)
        self.tokenize = pb_grpc.TokenizeStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)

    def close(self):
        self.channel.close()
        self.http.close()


@pytest.fixture(scope="module")
def embedder(engine, serve_app):
    with serve_app(engine, ServerSettings(grpc_port=0)) as (url, app):
        served = Served(url, app)
        yield served
        served.close()


def _tiny_server(serve_app, tiny_model, tmp_path_factory, minilm_path, name, head, labels,
                 settings=None):
    from pooler import Engine

    folder = tiny_model(tmp_path_factory.mktemp(name), minilm_path, head, labels)
    return serve_app(Engine(str(folder)), settings or ServerSettings(grpc_port=0),
                     owns_engine=True)


@pytest.fixture(scope="module")
def classifier(serve_app, tiny_model, tmp_path_factory, minilm_path):
    with _tiny_server(serve_app, tiny_model, tmp_path_factory, minilm_path, "grpc-cls",
                      "BertForSequenceClassification", 3) as (url, app):
        served = Served(url, app)
        yield served
        served.close()


@pytest.fixture(scope="module")
def reranker(serve_app, tiny_model, tmp_path_factory, minilm_path):
    with _tiny_server(serve_app, tiny_model, tmp_path_factory, minilm_path, "grpc-ce",
                      "BertForSequenceClassification", 1) as (url, app):
        served = Served(url, app)
        yield served
        served.close()


@pytest.fixture(scope="module")
def splade(serve_app, tiny_model, tmp_path_factory, minilm_path):
    with _tiny_server(serve_app, tiny_model, tmp_path_factory, minilm_path, "grpc-mlm",
                      "BertForMaskedLM", 1) as (url, app):
        served = Served(url, app)
        yield served
        served.close()


def status_of(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code(), info.value.details()


# ---- Info, health, reflection ------------------------------------------------------------------
def test_info_matches_http(embedder):
    info = embedder.info.Info(pb.InfoRequest())
    http = embedder.http.get("/info").json()
    assert info.model_type == pb.MODEL_TYPE_EMBEDDING
    assert info.model_id == http["model_id"] and info.version == http["version"]
    assert info.max_input_length == http["max_input_length"]
    assert info.max_batch_tokens == http["max_batch_tokens"]
    assert info.max_client_batch_size == http["max_client_batch_size"]


def test_health_by_model_kind(embedder, reranker):
    def status(served, service):
        return served.health.Check(health_pb2.HealthCheckRequest(service=service)).status

    serving, not_serving = (health_pb2.HealthCheckResponse.SERVING,
                            health_pb2.HealthCheckResponse.NOT_SERVING)
    assert status(embedder, "") == serving
    assert status(embedder, "tei.v1.Embed") == serving
    assert status(embedder, "tei.v1.Tokenize") == serving
    assert status(embedder, "tei.v1.Rerank") == not_serving
    assert status(reranker, "tei.v1.Rerank") == serving
    assert status(reranker, "tei.v1.Predict") == serving
    assert status(reranker, "tei.v1.Embed") == not_serving


def test_reflection_lists_and_describes_tei(embedder):
    stub = reflection_pb2_grpc.ServerReflectionStub(embedder.channel)
    answers = list(stub.ServerReflectionInfo(iter([
        reflection_pb2.ServerReflectionRequest(list_services=""),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="tei.v1.Embed")])))
    services = {s.name for s in answers[0].list_services_response.service}
    assert {"tei.v1.Info", "tei.v1.Embed", "tei.v1.Predict", "tei.v1.Rerank",
            "tei.v1.Tokenize", "grpc.health.v1.Health"} <= services
    from google.protobuf import descriptor_pb2

    described = descriptor_pb2.FileDescriptorProto.FromString(
        answers[1].file_descriptor_response.file_descriptor_proto[0])
    assert described.package == "tei.v1"
    assert "EmbedSparseStream" in {m.name for s in described.service for m in s.method}


# ---- Embed -------------------------------------------------------------------------------------
def test_embed_equals_http(embedder):
    for kwargs, body in (({}, {}), ({"normalize": False}, {"normalize": False}),
                         ({"dimensions": 16}, {"dimensions": 16})):
        answer = embedder.embed.Embed(pb.EmbedRequest(inputs="grpc and http agree", **kwargs))
        http = embedder.http.post("/embed", json={"inputs": "grpc and http agree", **body})
        np.testing.assert_allclose(answer.embeddings, http.json()[0], atol=TOL, rtol=0)
    assert answer.metadata.compute_tokens > 0
    assert answer.metadata.compute_chars == len("grpc and http agree")
    assert answer.metadata.total_time_ns >= answer.metadata.inference_time_ns > 0


def test_embed_stream_in_order(embedder):
    texts = [f"stream text number {i}" + " word" * i for i in range(6)]
    answers = list(embedder.embed.EmbedStream(iter(pb.EmbedRequest(inputs=t) for t in texts)))
    http = embedder.http.post("/embed", json={"inputs": texts}).json()
    assert len(answers) == len(texts)
    for answer, expected in zip(answers, http):
        np.testing.assert_allclose(answer.embeddings, expected, atol=TOL, rtol=0)


def test_embed_all_and_stream_equal_http(embedder):
    text = "token vectors"
    http = np.array(embedder.http.post("/embed_all", json={"inputs": text}).json()[0])
    for answer in (embedder.embed.EmbedAll(pb.EmbedAllRequest(inputs=text)),
                   next(embedder.embed.EmbedAllStream(iter([pb.EmbedAllRequest(inputs=text)])))):
        got = np.array([row.embeddings for row in answer.token_embeddings])
        assert got.shape == http.shape
        np.testing.assert_allclose(got, http, atol=TOL, rtol=0)


def test_embed_sparse_and_stream_equal_http(splade):
    text = "sparse lexical weights"
    http = splade.http.post("/embed_sparse", json={"inputs": text}).json()[0]
    for answer in (splade.embed.EmbedSparse(pb.EmbedSparseRequest(inputs=text)),
                   next(splade.embed.EmbedSparseStream(
                       iter([pb.EmbedSparseRequest(inputs=text)])))):
        # The same weights by vocabulary index (equal weights may come in either order).
        got = {v.index: v.value for v in answer.sparse_embeddings}
        want = {v["index"]: v["value"] for v in http}
        assert got.keys() == want.keys() and len(got) > 0
        np.testing.assert_allclose([got[i] for i in want], list(want.values()), atol=TOL,
                                   rtol=0)


# ---- Predict and Rerank ------------------------------------------------------------------------
def _predictions(answer):
    return [(p.label, p.score) for p in answer.predictions]


def _check_predictions(answer, http):
    assert [p.label for p in answer.predictions] == [p["label"] for p in http]
    np.testing.assert_allclose([p.score for p in answer.predictions],
                               [p["score"] for p in http], atol=TOL, rtol=0)


def test_predict_and_pair_equal_http(classifier):
    one = classifier.predict.Predict(pb.PredictRequest(inputs="I loved it"))
    _check_predictions(one, classifier.http.post("/predict",
                                                 json={"inputs": "I loved it"}).json())
    raw = classifier.predict.Predict(pb.PredictRequest(inputs="I loved it", raw_scores=True))
    _check_predictions(raw, classifier.http.post(
        "/predict", json={"inputs": "I loved it", "raw_scores": True}).json())
    pair = classifier.predict.PredictPair(pb.PredictPairRequest(inputs=["a premise", "a claim"]))
    _check_predictions(pair, classifier.http.post(
        "/predict", json={"inputs": ["a premise", "a claim"]}).json())
    texts = ["first", "second one", "third"]
    streamed = list(classifier.predict.PredictStream(
        iter(pb.PredictRequest(inputs=t) for t in texts)))
    batch = classifier.http.post("/predict", json={"inputs": [[t] for t in texts]}).json()
    for answer, expected in zip(streamed, batch, strict=True):
        _check_predictions(answer, expected)
    pairs = list(classifier.predict.PredictPairStream(
        iter([pb.PredictPairRequest(inputs=["a", "b"]), pb.PredictPairRequest(inputs=["c"])])))
    expected = classifier.http.post("/predict", json={"inputs": [["a", "b"], ["c"]]}).json()
    for answer, http in zip(pairs, expected, strict=True):
        _check_predictions(answer, http)


def test_rerank_and_stream_equal_http(reranker):
    query, texts = "what is pooling", ["mean of token vectors", "a swimming pool", "CLS token"]
    http = reranker.http.post("/rerank", json={"query": query, "texts": texts,
                                               "return_text": True}).json()
    answer = reranker.rerank.Rerank(pb.RerankRequest(query=query, texts=texts,
                                                     return_text=True))
    assert [r.index for r in answer.ranks] == [r["index"] for r in http]
    assert [r.text for r in answer.ranks] == [r["text"] for r in http]
    np.testing.assert_allclose([r.score for r in answer.ranks], [r["score"] for r in http],
                               atol=TOL, rtol=0)
    streamed = reranker.rerank.RerankStream(
        iter(pb.RerankStreamRequest(query=query, text=t) for t in texts))
    assert [r.index for r in streamed.ranks] == [r["index"] for r in http]
    assert not streamed.ranks[0].HasField("text")  # return_text unset in the first message
    np.testing.assert_allclose([r.score for r in streamed.ranks], [r["score"] for r in http],
                               atol=TOL, rtol=0)


def test_rerank_long_input_from_metadata(reranker):
    """pooler-long-input: chunk (call metadata; TEI's RerankRequest has no field for it) scores
    an over-long text in windows, as HTTP /rerank's long_input "chunk" does; without it
    truncate=false is an error, as in TEI; a bad value names the metadata key."""
    query = "what is pooling"
    texts = ["mean of token vectors " * 150, "a swimming pool"]
    code, message = status_of(lambda: reranker.rerank.Rerank(
        pb.RerankRequest(query=query, texts=texts)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "truncat" in message
    http = reranker.http.post("/rerank", json={"query": query, "texts": texts, "truncate": False,
                                               "long_input": "chunk", "chunk_overlap": 8,
                                               "chunk_aggregate": "mean"}).json()
    assert http[0].get("num_windows", 0) > 1 or http[1].get("num_windows", 0) > 1, http
    metadata = (("pooler-long-input", "chunk"), ("pooler-chunk-overlap", "8"),
                ("pooler-chunk-aggregate", "mean"))
    answer = reranker.rerank.Rerank(pb.RerankRequest(query=query, texts=texts),
                                    metadata=metadata)
    assert [r.index for r in answer.ranks] == [r["index"] for r in http]
    np.testing.assert_allclose([r.score for r in answer.ranks], [r["score"] for r in http],
                               atol=TOL, rtol=0)
    streamed = reranker.rerank.RerankStream(
        iter(pb.RerankStreamRequest(query=query, text=t) for t in texts), metadata=metadata)
    np.testing.assert_allclose([r.score for r in streamed.ranks], [r["score"] for r in http],
                               atol=TOL, rtol=0)
    for key, value in (("pooler-long-input", "split"), ("pooler-chunk-overlap", "-1"),
                       ("pooler-chunk-aggregate", "sum")):
        code, message = status_of(lambda: reranker.rerank.Rerank(
            pb.RerankRequest(query=query, texts=texts), metadata=((key, value),)))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and key in message, message


# ---- Tokenize and Decode -----------------------------------------------------------------------
def test_tokenize_decode_and_streams_equal_http(embedder):
    text = "Tokenize me, please"
    http = embedder.http.post("/tokenize", json={"inputs": text}).json()[0]
    for answer in (embedder.tokenize.Tokenize(pb.EncodeRequest(inputs=text,
                                                               add_special_tokens=True)),
                   next(embedder.tokenize.TokenizeStream(
                       iter([pb.EncodeRequest(inputs=text, add_special_tokens=True)])))):
        got = [{"id": t.id, "text": t.text, "special": t.special,
                "start": t.start if t.HasField("start") else None,
                "stop": t.stop if t.HasField("stop") else None} for t in answer.tokens]
        assert got == http
    ids = [t["id"] for t in http]
    expected = embedder.http.post("/decode", json={"ids": ids}).json()[0]
    assert embedder.tokenize.Decode(pb.DecodeRequest(ids=ids, skip_special_tokens=True)
                                    ).text == expected
    streamed = list(embedder.tokenize.DecodeStream(iter([
        pb.DecodeRequest(ids=ids, skip_special_tokens=True),
        pb.DecodeRequest(ids=ids[:2], skip_special_tokens=False)])))
    assert [a.text for a in streamed] == [
        expected, embedder.http.post("/decode", json={"ids": ids[:2],
                                                      "skip_special_tokens": False}).json()[0]]


# ---- errors -------------------------------------------------------------------------------------
def test_bad_input_gets_the_status_and_names_the_field(embedder, classifier, reranker):
    code, message = status_of(lambda: embedder.embed.Embed(pb.EmbedRequest(inputs="x",
                                                                           dimensions=0)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "dimensions" in message
    code, message = status_of(lambda: embedder.embed.Embed(
        pb.EmbedRequest(inputs="long " * 2000, truncate=False)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "truncat" in message
    code, message = status_of(lambda: embedder.tokenize.Decode(pb.DecodeRequest(
        ids=[10**7])))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "ids" in message
    code, message = status_of(lambda: classifier.predict.PredictPair(
        pb.PredictPairRequest(inputs=["a", "b", "c"])))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "`inputs`" in message
    code, message = status_of(lambda: reranker.rerank.Rerank(pb.RerankRequest(query="q")))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "`texts`" in message
    # The wrong model kind: FAILED_PRECONDITION, as TEI's Backend error.
    code, message = status_of(lambda: embedder.predict.Predict(pb.PredictRequest(inputs="x")))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "classifier" in message
    code, _ = status_of(lambda: classifier.embed.Embed(pb.EmbedRequest(inputs="x")))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    code, _ = status_of(lambda: embedder.rerank.Rerank(pb.RerankRequest(query="q",
                                                                        texts=["t"])))
    assert code == grpc.StatusCode.FAILED_PRECONDITION


def test_a_stream_answers_in_order_until_a_bad_message(embedder):
    stream = embedder.embed.EmbedStream(iter([pb.EmbedRequest(inputs="fine"),
                                              pb.EmbedRequest(inputs="x", dimensions=0),
                                              pb.EmbedRequest(inputs="never answered")]))
    first = next(stream)
    assert len(first.embeddings) == 384
    with pytest.raises(grpc.RpcError) as info:
        next(stream)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "dimensions" in info.value.details()


def test_grpc_calls_count_in_tei_metrics(embedder):
    def count():
        text = embedder.http.get("/metrics").text
        return sum(float(line.split()[-1]) for line in text.splitlines()
                   if line.startswith("te_request_success{"))

    before = count()
    embedder.embed.Embed(pb.EmbedRequest(inputs="counted"))
    assert count() == before + 1


# ---- API key ------------------------------------------------------------------------------------
def test_api_key_from_metadata(engine, serve_app):
    with serve_app(engine, ServerSettings(grpc_port=0, api_key="sesame")) as (url, app):
        served = Served(url, app)
        try:
            code, message = status_of(lambda: served.embed.Embed(pb.EmbedRequest(inputs="x")))
            assert code == grpc.StatusCode.UNAUTHENTICATED and "authorization" in message
            code, _ = status_of(lambda: served.info.Info(
                pb.InfoRequest(), metadata=[("authorization", "Bearer wrong")]))
            assert code == grpc.StatusCode.UNAUTHENTICATED
            code, _ = status_of(lambda: list(served.embed.EmbedStream(
                iter([pb.EmbedRequest(inputs="x")]))))
            assert code == grpc.StatusCode.UNAUTHENTICATED
            good = [("authorization", "Bearer sesame")]
            assert len(served.embed.Embed(pb.EmbedRequest(inputs="x"),
                                          metadata=good).embeddings) == 384
            # Health stays open, as TEI's.
            assert served.health.Check(health_pb2.HealthCheckRequest()).status == \
                health_pb2.HealthCheckResponse.SERVING
        finally:
            served.close()


# ---- the committed stubs -------------------------------------------------------------------------
def test_committed_stubs_are_generated_from_the_proto(tmp_path):
    pytest.importorskip("grpc_tools")
    # The same command as `make proto`: the proto filed under generated/, where the stubs live.
    out = subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc",
         "-Ipooler/server/grpc/generated=pooler/server/grpc", f"--python_out={tmp_path}",
         f"--pyi_out={tmp_path}", f"--grpc_python_out={tmp_path}", "pooler/server/grpc/tei.proto"],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for name in ("tei_pb2.py", "tei_pb2.pyi", "tei_pb2_grpc.py"):
        assert (tmp_path / "pooler/server/grpc/generated" / name).read_text() == \
            (REPO / "pooler/server/grpc/generated" / name).read_text(), f"{name}: run `make proto`"
