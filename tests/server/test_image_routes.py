"""Images over HTTP in each dialect's shape, against a tiny seeded CLIP served on 127.0.0.1:
vLLM's `messages` with image_url parts (/v1/embeddings, /pooling), vLLM's {"content": [...]}
queries and documents (/score, /rerank), Cohere v2's `images` and `inputs[].content`
(/v2/embed, also through the cohere SDK); http(s) URLs from a local fake image server (allowed
only with --allow-private-media-urls), file:// URLs only under --allowed-local-media-path;
every bad image a 4xx naming the item; the image caches on /metrics. Answers equal the offline
Engine's."""
from __future__ import annotations

import base64
import io
import struct
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import numpy as np
import pytest
from PIL import Image

from pooler.engine.llm import Engine
from pooler.server.settings import ServerSettings
from tests.models.image_text_folders import save_tiny_clip, save_tiny_siglip

ATOL = 1e-5


def _picture(seed: int, size=(40, 30)) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def _png(image: Image.Image, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt)
    return buf.getvalue()


def _data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def _bomb_png() -> bytes:
    """A 1x1 PNG whose header claims 30000 x 30000 pixels (900M: over the pixel limit)."""
    data = bytearray(_png(Image.new("L", (1, 1))))
    ihdr = bytearray(data[12:29])  # b"IHDR" + 13 bytes of fields
    ihdr[4:12] = struct.pack(">II", 30000, 30000)
    data[12:29] = ihdr
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(ihdr)) & 0xFFFFFFFF)
    return bytes(data)


CAT, DOG = _picture(1), _picture(2, (24, 50))
CAT_PNG = _png(CAT)


# ---- a local fake image server ---------------------------------------------------------------
class _Images(BaseHTTPRequestHandler):
    stall_seconds = 5.0

    def do_GET(self):  # noqa: N802 - http.server's name
        if self.path == "/cat.png":
            body, kind = CAT_PNG, "image/png"
        elif self.path == "/text":
            body, kind = b"hello, not an image", "text/plain"
        elif self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "/cat.png")
            self.end_headers()
            return
        elif self.path in ("/drip-headers", "/drip-body"):
            # One byte at a time, each well within a socket timeout: only a deadline on the
            # whole fetch ends it.
            head = (b"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nX-Pad: " + b"x" * 40
                    + b"\r\n\r\n")
            body = CAT_PNG
            try:
                if self.path == "/drip-body":
                    self.wfile.write(head)
                    head, body = b"", body
                for byte in head + body:
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(0.1)
            except OSError:
                pass  # cut off by the fetcher
            return
        elif self.path == "/stall":
            time.sleep(self.stall_seconds)  # never answers within the server's time limit
            body, kind = CAT_PNG, "image/png"
        else:
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def image_host():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


# ---- servers --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def clip_engine(tmp_path_factory):
    folder = save_tiny_clip(tmp_path_factory.mktemp("clip") / "clip")
    engine = Engine(str(folder), device="cpu")
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("media")
    (folder / "cat.png").write_bytes(CAT_PNG)
    return folder


@pytest.fixture(scope="module")
def clip(clip_engine, media_dir, serve_app):
    """Private URLs allowed, file:// under media_dir, 1.5 s fetch limit, 200 kB per image."""
    settings = ServerSettings(allow_private_media_urls=True,
                              allowed_local_media_path=str(media_dir),
                              media_fetch_timeout=1.5, max_image_bytes=200_000)
    with serve_app(clip_engine, settings) as (url, _), \
            httpx.Client(base_url=url, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def clip_default(clip_engine, serve_app):
    """The default media policy: no private URLs, no files."""
    with serve_app(clip_engine) as (url, _), httpx.Client(base_url=url, timeout=60) as client:
        yield client


def _chat(*parts):
    return [{"role": "user", "content": list(parts)}]


def _image_part(url):
    return {"type": "image_url", "image_url": {"url": url}}


def _text_part(text):
    return {"type": "text", "text": text}


def _embedding(engine, item, **kwargs):
    return engine.embed([item], **kwargs)[0].embedding


# ---- vLLM: messages on /v1/embeddings and /pooling ------------------------------------------
def test_embeddings_messages_image_and_text(clip, clip_engine):
    image = clip.post("/v1/embeddings", json={"messages": _chat(_image_part(
        _data_url(CAT_PNG)))})
    assert image.status_code == 200, image.text
    np.testing.assert_allclose(image.json()["data"][0]["embedding"],
                               _embedding(clip_engine, CAT), atol=ATOL)
    assert image.json()["usage"]["prompt_tokens"] > 0
    text = clip.post("/v1/embeddings", json={"messages": _chat(_text_part("a photo of a cat"))})
    assert text.status_code == 200, text.text
    np.testing.assert_allclose(text.json()["data"][0]["embedding"],
                               _embedding(clip_engine, "a photo of a cat"), atol=ATOL)
    # A batch of chats: one item each, in order; plain-string content is text.
    batch = clip.post("/v1/embeddings", json={"messages": [
        _chat(_image_part(_data_url(_png(DOG)))),
        [{"role": "user", "content": "dog"}]]})
    assert batch.status_code == 200, batch.text
    got = np.array([d["embedding"] for d in batch.json()["data"]])
    want = np.stack([o.embedding for o in clip_engine.embed([DOG, "dog"])])
    np.testing.assert_allclose(got, want, atol=ATOL)


def test_pooling_messages_image(clip, clip_engine):
    r = clip.post("/pooling", json={"messages": _chat(_image_part(_data_url(CAT_PNG)))})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(r.json()["data"][0]["data"], _embedding(clip_engine, CAT),
                               atol=ATOL)


def test_openai_client_posts_chat_embeddings(clip, clip_engine):
    openai = pytest.importorskip("openai")
    from openai.types.create_embedding_response import CreateEmbeddingResponse

    client = openai.OpenAI(base_url=f"{clip.base_url}/v1", api_key="unused")
    response = client.post("/embeddings", cast_to=CreateEmbeddingResponse, body={
        "messages": _chat(_image_part(_data_url(CAT_PNG))), "model": "clip",
        "encoding_format": "float"})
    np.testing.assert_allclose(response.data[0].embedding, _embedding(clip_engine, CAT),
                               atol=ATOL)


@pytest.mark.parametrize("version", [1, 2])
def test_siglip_images_and_texts(version, tmp_path, serve_app):
    """SigLIP and SigLIP2 (NaFlex patches) through the same routes: the Engine's numbers."""
    engine = Engine(str(save_tiny_siglip(tmp_path / "s", version=version)), device="cpu")
    with serve_app(engine, owns_engine=True) as (url, _), \
            httpx.Client(base_url=url, timeout=60) as client:
        r = client.post("/v1/embeddings", json={"messages": [
            _chat(_image_part(_data_url(_png(DOG)))), _chat(_text_part("a photo of a dog"))]})
        assert r.status_code == 200, r.text
        want = np.stack([o.embedding for o in engine.embed([DOG, "a photo of a dog"])])
        np.testing.assert_allclose([d["embedding"] for d in r.json()["data"]], want, atol=ATOL)
        r = client.post("/v2/embed", json={"input_type": "image",
                                           "images": [_data_url(_png(DOG))]})
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(r.json()["embeddings"]["float"][0], want[0], atol=ATOL)


# ---- vLLM: {"content": [...]} on /score and /rerank -----------------------------------------
def test_score_image_documents(clip, clip_engine):
    docs = [{"content": [_image_part(_data_url(CAT_PNG))]},
            {"content": [_image_part(_data_url(_png(DOG)))]}, "a photo of a dog"]
    for path in ("/score", "/v1/score"):
        r = clip.post(path, json={"queries": "a photo of a cat", "documents": docs})
        assert r.status_code == 200, r.text
        want = [o.score for o in clip_engine.score("a photo of a cat", [CAT, DOG,
                                                                        "a photo of a dog"])]
        np.testing.assert_allclose([d["score"] for d in r.json()["data"]], want, atol=ATOL)
    # An image query against text documents; one {"content": ...} document alone.
    r = clip.post("/score", json={"queries": {"content": [_image_part(_data_url(CAT_PNG))]},
                                  "documents": {"content": [_text_part("cat")]}})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(r.json()["data"][0]["score"],
                               clip_engine.score(CAT, ["cat"])[0].score, atol=ATOL)


def test_rerank_image_documents(clip, clip_engine):
    docs = ["a red car", {"content": [_image_part(_data_url(CAT_PNG))]},
            {"content": [_image_part(_data_url(_png(DOG)))]}]
    want = [o.score for o in clip_engine.score("a photo of a cat", ["a red car", CAT, DOG])]
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        r = clip.post(path, json={"query": "a photo of a cat", "documents": docs})
        assert r.status_code == 200, r.text
        results = r.json()["results"]
        assert [x["index"] for x in results] == list(np.argsort(-np.array(want), kind="stable"))
        by_index = {x["index"]: x for x in results}
        np.testing.assert_allclose([by_index[i]["relevance_score"] for i in range(3)], want,
                                   atol=ATOL)
        assert by_index[0]["document"] == {"text": "a red car"}
        assert by_index[1]["document"] == {"multi_modal": docs[1]["content"]}


def test_page_images_score_and_rerank_on_colmodernvbert(tmp_path, serve_app):
    """The same generic routes on a page retrieval model: text queries, page image documents,
    MaxSim scores equal to Engine.score's."""
    from tests.models.colmodernvbert_folders import page_image, save_tiny_colmodernvbert

    engine = Engine(str(save_tiny_colmodernvbert(tmp_path / "pages")), device="cpu")
    pages = [page_image(60, 90, seed=0), page_image(20, 20, seed=1)]
    docs = [{"content": [_image_part(_data_url(_png(p)))]} for p in pages]
    want = [o.score for o in engine.score("fox", pages)]
    with serve_app(engine, owns_engine=True) as (url, _), \
            httpx.Client(base_url=url, timeout=60) as client:
        r = client.post("/score", json={"queries": "fox", "documents": docs})
        assert r.status_code == 200, r.text
        np.testing.assert_allclose([d["score"] for d in r.json()["data"]], want, atol=1e-4)
        r = client.post("/v1/rerank", json={"query": "fox", "documents": docs,
                                            "return_documents": False})
        assert r.status_code == 200, r.text
        results = r.json()["results"]
        assert [x["index"] for x in results] == list(np.argsort(-np.array(want), kind="stable"))
        assert "document" not in results[0]


# ---- Cohere v2 -------------------------------------------------------------------------------
def test_cohere_v2_images_and_inputs(clip, clip_engine):
    r = clip.post("/v2/embed", json={"model": "clip", "input_type": "image",
                                     "images": [_data_url(CAT_PNG), _data_url(_png(DOG))],
                                     "embedding_types": ["float"]})
    assert r.status_code == 200, r.text
    body = r.json()
    want = np.stack([o.embedding for o in clip_engine.embed([CAT, DOG])])
    np.testing.assert_allclose(body["embeddings"]["float"], want, atol=ATOL)
    assert body["images"] == [{"width": 40, "height": 30, "format": "png", "bit_depth": 8},
                              {"width": 24, "height": 50, "format": "png", "bit_depth": 8}]
    r = clip.post("/v2/embed", json={"model": "clip", "input_type": "search_document",
                                     "inputs": [
                                         {"content": [{"type": "image_url", "image_url": {
                                             "url": _data_url(CAT_PNG)}}]},
                                         {"content": [_text_part("a photo"), _text_part("cat")]},
                                     ]})
    assert r.status_code == 200, r.text
    want = np.stack([o.embedding for o in clip_engine.embed([CAT, "a photo cat"])])
    np.testing.assert_allclose(r.json()["embeddings"]["float"], want, atol=ATOL)


def test_cohere_sdk_embeds_images(clip, clip_engine):
    cohere = pytest.importorskip("cohere")
    client = cohere.ClientV2(api_key="unused", base_url=str(clip.base_url))
    response = client.embed(model="clip", input_type="image", images=[_data_url(CAT_PNG)],
                            embedding_types=["float"])
    np.testing.assert_allclose(response.embeddings.float_[0], _embedding(clip_engine, CAT),
                               atol=ATOL)
    assert response.images[0].width == 40
    response = client.embed(model="clip", input_type="search_query", inputs=[
        cohere.EmbedInput(content=[cohere.ImageUrlEmbedContent(
            image_url=cohere.EmbedImageUrl(url=_data_url(_png(DOG))))])],
        embedding_types=["float"])
    np.testing.assert_allclose(response.embeddings.float_[0], _embedding(clip_engine, DOG),
                               atol=ATOL)
    with pytest.raises(cohere.core.ApiError) as err:
        client.embed(model="clip", input_type="image", images=["data:image/png;base64,AAAA"],
                     embedding_types=["float"])
    assert err.value.status_code == 400 and "images[0]" in err.value.body["message"]


# ---- URLs: http(s) and file:// ---------------------------------------------------------------
def test_http_urls_only_with_the_private_flag(clip, clip_default, clip_engine, image_host):
    body = {"messages": _chat(_image_part(f"{image_host}/cat.png"))}
    r = clip.post("/v1/embeddings", json=body)
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(r.json()["data"][0]["embedding"], _embedding(clip_engine, CAT),
                               atol=ATOL)
    r = clip.post("/v1/embeddings", json={"messages": _chat(_image_part(
        f"{image_host}/redirect"))})
    assert r.status_code == 200, r.text
    refused = clip_default.post("/v1/embeddings", json=body)
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert "messages[0].content[0]" in error["message"] and "private" in error["message"]


def test_file_urls_only_under_the_allowed_folder(clip, clip_default, clip_engine, media_dir,
                                                 tmp_path):
    inside = {"messages": _chat(_image_part(f"file://{media_dir / 'cat.png'}"))}
    r = clip.post("/v1/embeddings", json=inside)
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(r.json()["data"][0]["embedding"], _embedding(clip_engine, CAT),
                               atol=ATOL)
    (tmp_path / "out.png").write_bytes(CAT_PNG)
    outside = clip.post("/v1/embeddings", json={"messages": _chat(_image_part(
        f"file://{tmp_path / 'out.png'}"))})
    assert outside.status_code == 400 and "outside the allowed" in outside.text
    off = clip_default.post("/v1/embeddings", json=inside)
    assert off.status_code == 400 and "--allowed-local-media-path" in off.text


def test_a_stalled_url_is_a_400_and_other_requests_go_on(clip, clip_engine, image_host):
    def stalled():
        start = time.monotonic()
        r = clip.post("/v1/embeddings", json={"messages": _chat(_image_part(
            f"{image_host}/stall"))})
        return r, time.monotonic() - start

    with ThreadPoolExecutor(2) as pool:
        slow = pool.submit(stalled)
        time.sleep(0.2)
        fine = clip.post("/v1/embeddings", json={"messages": _chat(_image_part(
            _data_url(CAT_PNG)))})
        assert fine.status_code == 200, fine.text
        r, seconds = slow.result()
    assert r.status_code == 400 and "longer than 1.5 s" in r.json()["error"]["message"]
    assert seconds < 4


@pytest.mark.parametrize("path", ["/drip-headers", "/drip-body"])
def test_a_dripping_url_is_cut_at_the_time_limit(clip, image_host, path):
    start = time.monotonic()
    r = clip.post("/v1/embeddings", json={"messages": _chat(_image_part(
        f"{image_host}{path}"))})
    assert r.status_code == 400 and "longer than 1.5 s" in r.json()["error"]["message"], r.text
    assert time.monotonic() - start < 4


# ---- bad images: a 4xx naming the item -------------------------------------------------------
BAD = {
    "not an image": (_data_url(b"certainly not an image"), "is not an image"),
    "truncated": (_data_url(CAT_PNG[: len(CAT_PNG) // 2]), "truncated"),
    "bomb": (_data_url(_bomb_png()), "pixels"),
    "over the byte limit": (_data_url(_png(_picture(3, (300, 300)))), "200000 bytes"),
    "unsupported format": (_data_url(_png(CAT, "PPM"), "image/x-portable-pixmap"),
                           "not supported"),
    "bad base64": ("data:image/png;base64,@@@", "base64"),
    "not a URL": ("cat.png", "not an image URL"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_images_are_400s_naming_the_item(clip, case):
    url, says = BAD[case]
    r = clip.post("/v1/embeddings", json={"messages": [
        _chat(_text_part("fine")), _chat(_image_part(url))]})
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert "messages[1][0].content[0]" in message and says in message, message
    # The same image as a rerank document and as a Cohere image: named where it sits.
    r = clip.post("/rerank", json={"query": "cat", "documents": [
        "text", {"content": [_image_part(url)]}]})
    assert r.status_code == 400 and "documents[1].content[0]" in r.json()["error"]["message"]
    r = clip.post("/v2/embed", json={"input_type": "image", "images": [_data_url(CAT_PNG), url]})
    assert r.status_code == 400 and "images[1]" in r.json()["message"]


def test_unreachable_url_and_http_errors(clip, image_host):
    for url, says in ((f"{image_host}/missing.png", "HTTP 404"),
                      (f"{image_host}/text", "is not an image"),
                      ("http://127.0.0.1:9/x.png", "failed")):
        r = clip.post("/v1/embeddings", json={"messages": _chat(_image_part(url))})
        assert r.status_code == 400, r.text
        assert says in r.json()["error"]["message"]


def test_parts_pooler_refuses(clip):
    for part, says in (({"type": "image_embeds", "image_embeds": "AAAA"}, "image_embeds"),
                       ({"type": "input_audio", "input_audio": {}}, "'input_audio' part"),
                       ({"type": "image_url", "image_url": {}}, "image_url.url")):
        r = clip.post("/v1/embeddings", json={"messages": _chat(part)})
        assert r.status_code == 400 and says in r.json()["error"]["message"], r.text
    two = clip.post("/v1/embeddings", json={"messages": _chat(
        _image_part(_data_url(CAT_PNG)), _image_part(_data_url(CAT_PNG)))})
    assert two.status_code == 400 and "2 images" in two.json()["error"]["message"]
    # CLIP embeds a text or an image, not both at once (vLLM refuses that too).
    both = clip.post("/v1/embeddings", json={"messages": _chat(
        _text_part("a cat"), _image_part(_data_url(CAT_PNG)))})
    assert both.status_code == 400 and "one or the other" in both.json()["error"]["message"]
    r = clip.post("/v2/embed", json={"input_type": "image", "texts": ["a cat"]})
    assert r.status_code == 400 and "input_type" in r.json()["message"]


def test_images_to_a_text_only_model_are_refused(client):
    """The session's MiniLM server: an image anywhere is a 400 naming it, nothing fetched."""
    part = _image_part("http://192.0.2.1/never-fetched.png")
    r = client.post("/v1/embeddings", json={"messages": _chat(_text_part("hi"), part)})
    assert r.status_code == 400
    assert "messages[0].content[1] is an image" in r.json()["error"]["message"]
    assert "text-only" in r.json()["error"]["message"]
    r = client.post("/rerank", json={"query": "hi", "documents": [{"content": [part]}]})
    assert r.status_code == 400 and "documents[0].content[0]" in r.json()["error"]["message"]
    r = client.post("/v2/embed", json={"input_type": "image", "images": [_data_url(CAT_PNG)]})
    assert r.status_code == 400 and "text-only" in r.json()["message"]
    # Text parts in `inputs` still embed there.
    r = client.post("/v2/embed", json={"input_type": "search_query",
                                       "inputs": [{"content": [_text_part("hi")]}]})
    assert r.status_code == 200, r.text


# ---- metrics ---------------------------------------------------------------------------------
def _metric(text: str, name: str, cache: str) -> float:
    for line in text.splitlines():
        if line.startswith(f'{name}{{cache="{cache}"}}'):
            return float(line.split()[-1])
    raise AssertionError(f"{name}{{cache={cache!r}}} not on /metrics")


def test_image_caches_on_metrics(clip):
    picture = _data_url(_png(_picture(7)))
    before = clip.get("/metrics").text
    for _ in range(2):
        r = clip.post("/v1/embeddings", json={"messages": _chat(_image_part(picture))})
        assert r.status_code == 200, r.text
    after = clip.get("/metrics").text
    for cache in ("mm", "encoder"):
        assert _metric(after, "pooler_image_cache_misses_total", cache) >= \
            _metric(before, "pooler_image_cache_misses_total", cache) + 1
        assert _metric(after, "pooler_image_cache_hits_total", cache) >= \
            _metric(before, "pooler_image_cache_hits_total", cache) + 1
        assert _metric(after, "pooler_image_cache_entries", cache) >= 1
        assert 0 < _metric(after, "pooler_image_cache_bytes", cache) <= \
            _metric(after, "pooler_image_cache_capacity_bytes", cache)


def test_text_models_have_no_image_cache_metrics(client):
    assert "pooler_image_cache" not in client.get("/metrics").text


# ---- the spec ------------------------------------------------------------------------------
def _schemas(client) -> dict:
    return client.get("/openapi.json").json()["components"]["schemas"]


def _part_refs(schema: dict) -> set[str]:
    items = next(o for o in schema["anyOf"] if o.get("type") == "array")["items"]
    return {o["$ref"].rsplit("/", 1)[-1] for o in items["anyOf"]}


def test_spec_declares_image_parts_where_the_model_takes_them(clip, client):
    clip_spec, text_spec = _schemas(clip), _schemas(client)
    assert _part_refs(clip_spec["ChatMessage"]["properties"]["content"]) == \
        {"TextPart", "ImageURLPart"}
    assert _part_refs(text_spec["ChatMessage"]["properties"]["content"]) == {"TextPart"}
    assert "ImageURL" in clip_spec and "url" in clip_spec["ImageURL"]["properties"]
    images = clip_spec["CohereEmbedRequest"]["properties"]["images"]
    assert any(o.get("type") == "array" for o in images["anyOf"])
    assert text_spec["CohereEmbedRequest"]["properties"]["images"].get("type") == "null" or \
        all(o.get("type") == "null" for o in
            text_spec["CohereEmbedRequest"]["properties"]["images"].get("anyOf", []))
    score_sides = clip_spec["ScoreRequest"]["properties"]["documents"]
    assert "ScoreMultiModal" in str(score_sides)


# ---- flags -----------------------------------------------------------------------------------
def test_media_flags_reach_the_settings(tmp_path):
    from pooler.cli.main import build_parser
    from pooler.cli.serve import _settings

    s = _settings(build_parser().parse_args([
        "serve", "m", "--allowed-local-media-path", str(tmp_path), "--allow-private-media-urls",
        "--media-fetch-timeout", "2.5", "--max-image-bytes", "1000", "--media-workers", "3"]))
    assert (s.allowed_local_media_path, s.allow_private_media_urls, s.media_fetch_timeout,
            s.max_image_bytes, s.media_workers) == (str(tmp_path), True, 2.5, 1000, 3)
    s = _settings(build_parser().parse_args(["serve", "m"]))
    assert (s.allowed_local_media_path, s.allow_private_media_urls) == (None, False)
    with pytest.raises(ValueError, match="allowed_local_media_path must be an existing folder"):
        ServerSettings(allowed_local_media_path=str(tmp_path / "absent"))
    with pytest.raises(ValueError, match="media_fetch_timeout must be positive"):
        ServerSettings(media_fetch_timeout=0)


# ---- admission -------------------------------------------------------------------------------
def test_data_urls_are_not_counted_as_text_tokens(clip_engine, serve_app):
    """The token queue's early estimate (a token per 4 body bytes) leaves image URLs out: an
    image costs its patches, counted exactly once processed. Here the queue holds 1,000 tokens
    and something else is in flight, so 100 kB of base64 read as text would be a 503."""
    settings = ServerSettings(max_queue_tokens=1000, small_request_inputs=1,
                              max_image_bytes=2**20)
    big = _data_url(_png(_picture(5, (200, 200))))
    assert len(big) > 100_000
    with serve_app(clip_engine, settings) as (url, app), \
            httpx.Client(base_url=url, timeout=60) as client:
        admission = app.state.pooler.token_admission
        admission.in_flight += 1  # another request's tokens
        try:
            r = client.post("/v2/embed", json={"input_type": "image", "images": [big, big]})
            assert r.status_code == 200, r.text
            r = client.post("/v2/embed", json={"texts": ["a cat " * 30_000, "dog"],
                                               "input_type": "search_query"})
            assert r.status_code == 503, r.text  # text still counts by its size
        finally:
            admission.in_flight -= 1


def test_too_many_images_are_refused_before_any_fetch(clip_engine, serve_app, image_host):
    settings = ServerSettings(max_input_items=2, allow_private_media_urls=True)
    with serve_app(clip_engine, settings) as (url, _), \
            httpx.Client(base_url=url, timeout=60) as client:
        start = time.monotonic()
        r = client.post("/v2/embed", json={"input_type": "image",
                                           "images": [f"{image_host}/stall"] * 3})
        assert r.status_code == 413 and "--max-input-items" in r.json()["message"], r.text
        assert time.monotonic() - start < 2  # nothing was fetched
