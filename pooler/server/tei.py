"""text-embeddings-inference-compatible routes: /embed, /embed_all, /predict, /embed_sparse,
/decode; TEI's /rerank and /tokenize bodies are dispatched here from the shared paths.

TEI's defaults are kept: normalize=true, truncate=false (an over-long input is a 400, as TEI
without --auto-truncate), truncation_direction "Right"/"Left" in either case.
"""
from __future__ import annotations

from fastapi import APIRouter, Request

from pooler.server.errors import ERROR_RESPONSES, bad_request, unsupported
from pooler.server.protocol import (TEIDecodeRequest, TEIEmbedAllRequest, TEIEmbedRequest,
                                    TEIPredictRequest, TEIRerankRequest, TEISparseRequest,
                                    TEISparseValue, TEITokenizeRequest)
from pooler.server.state import ServerState

router = APIRouter(tags=["TEI"])


def get_state(request: Request) -> ServerState:
    return request.app.state.pooler


def check_token_ids(state: ServerState, ids: list[int], field: str) -> None:
    vocab = state.engine.tokenizer.vocab_size
    bad = [t for t in ids if t < 0 or t >= vocab]
    if bad:
        raise bad_request(f"'{field}' has token ids outside the vocabulary [0, {vocab}): "
                          f"{bad[:5]}.", field)


@router.post("/embed", response_model=list[list[float]], responses=ERROR_RESPONSES)
async def embed(body: TEIEmbedRequest, request: Request):
    state = get_state(request)
    state.require("embed", "embed", "embeddings")
    items = state.inputs(body.inputs, "inputs")
    state.check_dimensions(body.dimensions)

    def compute():
        outputs = state.engine.embed(
            items, normalize=body.normalize, dimensions=body.dimensions,
            truncate=bool(body.truncate), truncation_direction=body.truncation_direction.lower(),
            prompt_name=body.prompt_name, use_tqdm=False)
        return [o.embedding.tolist() for o in outputs]

    return await state.respond(request, len(items), "inputs", compute)


@router.post("/embed_all", response_model=list[list[list[float]]], responses=ERROR_RESPONSES)
async def embed_all(body: TEIEmbedAllRequest, request: Request):
    """One vector per token (no pooling, no normalization), as TEI."""
    state = get_state(request)
    state.require("token_embed", "token_embed", "per-token embeddings")
    items = state.inputs(body.inputs, "inputs")

    def compute():
        outputs = state.engine.token_embed(
            items, normalize=False, truncate=bool(body.truncate),
            truncation_direction=body.truncation_direction.lower(),
            prompt_name=body.prompt_name, use_tqdm=False)
        return [o.embeddings.tolist() for o in outputs]

    return await state.respond(request, len(items), "inputs", compute)


async def rerank_tei(body: TEIRerankRequest, request: Request):
    """TEI's /rerank: {query, texts} -> [{index, score, text?}] best first."""
    state = get_state(request)
    state.require("rerank", None, "reranking")
    if not body.texts:
        raise bad_request("'texts' is empty: pass at least one text.", "texts")

    def compute():
        results = state.call("rerank", body.query, list(body.texts),
                             return_documents=body.return_text,
                             use_activation=False if body.raw_scores else None,
                             use_tqdm=False, **state.truncation(body, only_set=True))
        ranked = sorted(results, key=lambda r: -float(r.score))
        out = []
        for r in ranked:
            item = {"index": int(r.index), "score": float(r.score)}
            if body.return_text:
                item["text"] = body.texts[r.index]
            out.append(item)
        return out

    return await state.respond(request, len(body.texts) + 1, "texts", compute)


def _predict_inputs(raw) -> tuple[list[str], list[str] | None, bool]:
    """TEI: a text; a [text, pair]; or a list of texts or of [text, pair] lists.
    Returns (texts, pairs or None, single)."""
    if isinstance(raw, str):
        return [raw], None, True
    if not raw:
        raise bad_request("'inputs' is empty: pass at least one text.", "inputs")
    if all(isinstance(x, str) for x in raw):
        if len(raw) == 2:  # TEI reads a 2-list of strings as one (text, text_pair)
            return [raw[0]], [raw[1]], True
        return list(raw), None, False
    for i, pair in enumerate(raw):
        if len(pair) != 2:
            raise bad_request(f"inputs[{i}] must be a [text, text_pair] list of two strings, "
                              f"got {len(pair)} items.", "inputs")
    return [p[0] for p in raw], [p[1] for p in raw], False


@router.post("/predict", response_model=list, responses=ERROR_RESPONSES)
async def predict(body: TEIPredictRequest, request: Request):
    """Sequence classification: [{label, score}] for one input (best first), a list of those
    for a batch. raw_scores=true gives logits."""
    state = get_state(request)
    state.require("classify", "classify", "classification")
    texts, pairs, single = _predict_inputs(body.inputs)

    def compute():
        outputs = state.call("classify", texts, text_pair=pairs,
                             use_activation=False if body.raw_scores else None,
                             use_tqdm=False, **state.truncation(body, only_set=True))
        ranked = [sorted(({"label": str(l["label"]), "score": float(l["score"])}
                          for l in o.labels), key=lambda x: -x["score"]) for o in outputs]
        return ranked[0] if single else ranked

    return await state.respond(request, len(texts), "inputs", compute)


@router.post("/embed_sparse", response_model=list[list[TEISparseValue]],
             responses=ERROR_RESPONSES)
async def embed_sparse(body: TEISparseRequest, request: Request):
    state = get_state(request)
    state.require("embed_sparse", None, "sparse embeddings")
    if state.engine.model_config.head != "mlm":
        raise unsupported("sparse embeddings: they need a masked-LM model (*ForMaskedLM, e.g. "
                          f"SPLADE) and this one is {state.engine.model_config.architecture}")
    items = state.inputs(body.inputs, "inputs")

    def compute():
        outputs = state.call("embed_sparse", items, use_tqdm=False, **state.truncation(body, only_set=True))
        return [[{"index": int(i), "value": float(v)} for i, v in zip(o.indices, o.values)]
                for o in outputs]

    return await state.respond(request, len(items), "inputs", compute)


async def tokenize_tei(body: TEITokenizeRequest, request: Request):
    state = get_state(request)
    texts = [body.inputs] if isinstance(body.inputs, str) else list(body.inputs)
    if not texts:
        raise bad_request("'inputs' is empty: pass at least one text.", "inputs")
    try:
        prompt = state.engine.processor.resolve_prompt(None, body.prompt_name)
    except ValueError as exc:
        raise bad_request(str(exc), "prompt_name") from None
    if body.prompt_name is None:
        prompt = None  # TEI adds a prompt only when asked to
    tokenizer = state.engine.tokenizer

    def compute():
        full = [(prompt or "") + t for t in texts]
        encoded = tokenizer.encode_batch(full, add_special_tokens=body.add_special_tokens)
        out = []
        for text, enc in zip(full, encoded):
            tokens = []
            for tid, special, (start, stop) in zip(enc.input_ids, enc.special_tokens_mask,
                                                   enc.offsets):
                if special:
                    tokens.append({"id": tid, "text": tokenizer.id_to_token(tid),
                                   "special": True, "start": None, "stop": None})
                else:
                    tokens.append({"id": tid, "text": text[start:stop], "special": False,
                                   "start": start, "stop": stop})
            out.append(tokens)
        return out

    return await state.respond(request, len(texts), "inputs", compute)


@router.post("/decode", response_model=list[str], responses=ERROR_RESPONSES)
async def decode(body: TEIDecodeRequest, request: Request):
    state = get_state(request)
    batches = body.ids if body.ids and isinstance(body.ids[0], list) else [body.ids]
    for ids in batches:
        check_token_ids(state, ids, "ids")

    def compute():
        return [state.engine.tokenizer.decode(ids, skip_special_tokens=body.skip_special_tokens)
                for ids in batches]

    return await state.respond(request, len(batches), "ids", compute)

