"""The served model's own OpenAPI spec: `/openapi.json` promises only what this server accepts.

The request models (protocol.py) are shared by every model kind, so their generic schema
promises too much: /classify on an embedder, `dimensions: 0`, a `prompt_name` the model does not
declare, token ids outside the vocabulary. A fuzzer (schemathesis, tests/server/test_fuzz.py)
then sees schema-valid requests refused. This module narrows the generated spec per model:
  - routes the model cannot serve are left out of the spec (they still answer a clear 400);
  - fields whose valid values depend on the model get them: `task` (the model's tasks),
    `prompt_name` (its declared prompts), `dimensions` (1 .. its vector size), token ids
    (0 .. vocabulary size - 1);
  - fields the handlers refuse when empty get minItems 1;
  - the score request needs `queries` or `text_1`, with one query when its other side is
    given (N x N is served too; JSON Schema cannot tie two lists' lengths);
  - fields the handlers refuse together, or must agree, say so (allOf / anyOf).
Rules no schema can state (token counts) are in the fields' descriptions; the fuzzer keeps them
out of its bodies with a documented hook (tests/server/schemathesis_hooks.py).
Routes not named in ROUTE_NEEDS are kept as they are (new routes stay visible by default).
"""
from __future__ import annotations

import copy
import inspect
from typing import Any, Callable

# Path -> what the engine must have for the route to serve anything.
RouteCheck = Callable[[Any], bool]


def _has_task(*tasks: str) -> RouteCheck:
    return lambda engine: any(t in engine.supported_tasks for t in tasks)


def _is_bge_m3(engine) -> bool:
    return getattr(engine.model_config, "bge_m3", None) is not None


def _is_mlm(engine) -> bool:
    return engine.model_config.head == "mlm"


def _not_gliner(engine) -> bool:
    """A GLiNER model needs entity labels with each request: only /ner takes them."""
    return getattr(engine.model_config, "gliner", None) is None


def _scores(engine) -> bool:
    """Scoring works for ColBERT (MaxSim), cross-encoders (one relevance label) and
    bi-encoders (cosine)."""
    tasks = engine.supported_tasks
    if engine.model_config.colbert is not None or "embed" in tasks:
        return True
    return "classify" in tasks and engine.core.model_runner.output_size("classify") == 1


ROUTE_NEEDS: dict[str, RouteCheck] = {
    "/v1/embeddings": _has_task("embed"),
    "/embed": _has_task("embed"),
    "/embeddings": _has_task("embed"),
    "/v1/embed": _has_task("embed"), "/v2/embed": _has_task("embed"),  # Cohere
    "/similarity": _has_task("embed"),
    "/embed_chunks": lambda e: {"embed", "token_embed"} <= set(e.supported_tasks),
    # TEI's catch-all answers embedders, classifiers, token classifiers and SPLADE.
    "/": lambda e: _not_gliner(e) and (
        bool({"embed", "classify", "token_classify"} & set(e.supported_tasks)) or _is_mlm(e)),
    "/pooling": _not_gliner, "/invocations": _not_gliner,
    # vLLM's run-time LoRA routes, on a server started with --enable-lora / --lora-modules.
    "/v1/load_lora_adapter": lambda e: bool(getattr(e, "lora_enabled", False)),
    "/v1/unload_lora_adapter": lambda e: bool(getattr(e, "lora_enabled", False)),
    "/bge_m3/embed": _is_bge_m3, "/bge_m3/score": _is_bge_m3,
    "/embed_all": _has_task("token_embed"),
    "/classify": _has_task("classify"),
    "/predict": _has_task("classify"),
    "/ner": _has_task("token_classify"),
    "/embed_sparse": _is_mlm,
    "/score": _scores, "/v1/score": _scores,
    "/rerank": _scores, "/v1/rerank": _scores, "/v2/rerank": _scores,
}

# Operations served whatever the model, on a path whose other operations depend on it:
# GET / is TEI's health check beside its catch-all POST /.
_ALWAYS_SERVED = {("/", "get")}

# GLiNER labels the spec promises: this many characters each, one per this many tokens of the
# model's limit (a character is at most one token of a DeBERTa Unigram vocabulary, plus the
# <<ENT>> marker and the word-start piece; the rest is margin for normalizer expansions).
_LABEL_CHARS = 50
_TOKENS_PER_LABEL = 60

# Fields the handlers refuse when they are empty lists.
_NON_EMPTY = {"input", "inputs", "documents", "texts", "queries", "text_1", "text_2", "tokens",
              "ids", "messages", "sentences", "items", "data_1", "data_2", "images", "content"}
# Fields that carry token ids (alone or among texts).
_TOKEN_ID_FIELDS = {"input", "inputs", "tokens", "ids", "queries", "documents", "text_1",
                    "text_2", "query"}
# A score body's query side and the fields it pairs with (vLLM's four spellings).
_QUERY_SIDES = {"queries": ("documents", "items"), "data_1": ("data_2",), "text_1": ("text_2",)}
# Bodies that carry the truncation fields but never truncate (vLLM's tokenizer routes): any
# integer is taken there and ignored.
_NO_TRUNCATION = {"TokenizeRequest", "DetokenizeRequest"}
# A text with one printable ASCII character has at least one token under any tokenizer
# (WordPiece, BPE, SentencePiece; [UNK] at worst); whitespace, control characters and lone
# combining marks may have none.
_HAS_A_TOKEN = "[!-~]"
# A character that is not whitespace for Python's str.strip (the server's check) nor for JSON
# Schema's \s.
_NOT_BLANK = "[^\\s\\x1c-\\x1f\\x85]"


def drop_unserved_paths(spec: dict, engine) -> None:
    """Remove the routes `engine`'s model is not served on (ROUTE_NEEDS), keeping the
    operations served whatever the model (_ALWAYS_SERVED); in place."""
    for path in list(spec.get("paths", {})):
        check = ROUTE_NEEDS.get(path)
        if check is not None and not _safe(check, engine):
            kept = {method: operation for method, operation in spec["paths"][path].items()
                    if (path, method) in _ALWAYS_SERVED}
            if kept:
                spec["paths"][path] = kept
            else:
                del spec["paths"][path]


def narrow_openapi(spec: dict, engine, long_input: str = "truncate") -> dict:
    """Narrow a generated spec (FastAPI's app.openapi()) to what `engine` serves; in place.
    long_input: the server's --long-input (what an unset `long_input` means)."""
    drop_unserved_paths(spec, engine)
    facts = _model_facts(engine)
    facts["long_input"] = long_input
    for schema in spec.get("components", {}).get("schemas", {}).values():
        _narrow_properties(schema, facts)
    # Inline request bodies (openapi_extra) too.
    for item in spec.get("paths", {}).values():
        for operation in item.values():
            content = operation.get("requestBody", {}).get("content", {})
            for media in content.values():
                _narrow_properties(media.get("schema", {}), facts)
                _hoist_defs(media.get("schema", {}), spec)
    _narrow_catch_alls(spec, facts)
    if facts["gliner"]:  # /ner's pipeline body (no labels) is not served by a GLiNER model
        _keep_first_option(spec, "/ner")
    if not facts["cross_encoder"]:
        _drop_tei_rerank(spec)
    _nullable_optionals(spec)
    return spec


def _nullable_optionals(spec: dict) -> None:
    """Request bodies take null for any optional field, meaning unset (protocol.py,
    drop_nulls): say so in the spec, for every schema a request body reaches."""
    schemas = spec.get("components", {}).get("schemas", {})
    seen: set[int] = set()

    def visit(node):
        if isinstance(node, list):
            for item in node:
                visit(item)
            return
        if not isinstance(node, dict) or id(node) in seen:
            return
        seen.add(id(node))
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
            visit(schemas.get(ref.rsplit("/", 1)[-1]))
        required = node.get("required")  # a list on a schema (a bool on a requestBody)
        required = set(required) if isinstance(required, list) else set()
        for name, prop in list(node.get("properties", {}).items()):
            if name not in required and isinstance(prop, dict) and not _allows_null(prop):
                node["properties"][name] = prop = _or_null(prop)
        for value in node.values():
            if isinstance(value, (dict, list)):
                visit(value)

    for item in spec.get("paths", {}).values():
        for operation in item.values():
            if isinstance(operation, dict):
                visit(operation.get("requestBody", {}))


def _allows_null(prop: dict) -> bool:
    if not prop or prop.get("type") == "null" or None in prop.get("enum", ()):
        return True
    return any(_allows_null(o) for o in prop.get("anyOf", []) + prop.get("oneOf", [])
               if isinstance(o, dict))


def _or_null(prop: dict) -> dict:
    kept = {k: prop[k] for k in ("default", "description", "title") if k in prop}
    inner = {k: v for k, v in prop.items() if k not in kept}
    return {"anyOf": [inner, {"type": "null"}], **kept}


def _keep_first_option(spec: dict, path: str) -> None:
    content = spec.get("paths", {}).get(path, {}).get("post", {}).get(
        "requestBody", {}).get("content", {}).get("application/json", {})
    options = content.get("schema", {}).get("anyOf")
    if options:
        content["schema"] = options[0]


def _drop_tei_rerank(spec: dict) -> None:
    """/rerank's TEI body ({query, texts}) needs a cross-encoder (else 424): keep the vLLM one."""
    content = spec.get("paths", {}).get("/rerank", {}).get("post", {}).get(
        "requestBody", {}).get("content", {}).get("application/json", {})
    options = content.get("schema", {}).get("oneOf")
    if options:
        kept = [o for o in options if "texts" not in o.get("properties", {})]
        content["schema"] = kept[0] if len(kept) == 1 else {"oneOf": kept}


def _hoist_defs(schema: dict, spec: dict) -> None:
    """Inline bodies (model_json_schema()) carry their own `$defs` with `#/$defs/X` refs, which
    resolve against the document root: move them to components and point the refs there."""
    components = spec.setdefault("components", {}).setdefault("schemas", {})

    def visit(node):
        if isinstance(node, dict):
            for name, sub in node.pop("$defs", {}).items():
                visit(sub)
                components.setdefault(name, sub)
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                node["$ref"] = "#/components/schemas/" + ref[len("#/$defs/"):]
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    visit(schema)


def _narrow_catch_alls(spec: dict, facts: dict) -> None:
    """Routes that take any object and dispatch on it: the spec shows a body they always serve.
    /invocations: a vLLM pooling request (its last handler, always there). TEI's /: `inputs`
    as text (every model kind answers it: /embed, /predict, entities)."""
    paths = spec.get("paths", {})
    invocation = {"$ref": "#/components/schemas/PoolingRequest"}
    pooling = spec.get("components", {}).get("schemas", {}).get("PoolingRequest")
    if pooling and "classify" in facts["tasks"] and "embed" not in facts["tasks"]:
        # On a classifier the classify handler takes such a body first (it ignores the
        # pooling-only fields), and /classify truncates from the right only.
        invocation = copy.deepcopy(pooling)
        properties = invocation.get("properties", {})
        if "truncation_side" in properties:
            _set_null(properties["truncation_side"])
        if "truncation_direction" in properties:
            _set_enum(properties["truncation_direction"], ["right", "Right"], nullable=False)
    elif pooling and "embed" in facts["tasks"]:
        # The embeddings handler takes such a body first, whatever its `task` holds (it
        # ignores the field).
        invocation = copy.deepcopy(pooling)
        if "task" in invocation.get("properties", {}):
            invocation["properties"]["task"] = {}
    root_inputs = [{"type": "string"},
                   {"type": "array", "items": {"type": "string"}, "minItems": 1}]
    if facts["default_task"] == "classify":
        # /predict: a text, [text] or [text, pair], or a batch of those lists (a flat list of
        # more than two texts is a 422 there)
        one = {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 2}
        root_inputs = [{"type": "string"}, one, {"type": "array", "items": one, "minItems": 1}]
    if facts["default_task"] == "embed" and facts["vocab"]:
        # /embed (and /embed_sparse) take token ids too
        ids = {"type": "integer", "minimum": 0, "maximum": facts["vocab"] - 1}
        root_inputs += [{"type": "array", "items": ids, "minItems": 1},
                        {"type": "array", "minItems": 1,
                         "items": {"type": "array", "items": ids, "minItems": 1}}]
    bodies = {"/invocations": invocation,
              "/": {"type": "object", "required": ["inputs"], "properties": {"inputs": {
                  "anyOf": root_inputs}}}}
    schemas = spec.get("components", {}).get("schemas", {})
    for path, body in bodies.items():
        if "$ref" in body and body["$ref"].rsplit("/", 1)[-1] not in schemas:
            continue
        content = paths.get(path, {}).get("post", {}).get("requestBody", {}).get("content", {})
        if "application/json" in content:
            content["application/json"]["schema"] = body


def _safe(check: RouteCheck, engine) -> bool:
    try:
        return bool(check(engine))
    except Exception:  # a check that cannot decide keeps the route documented
        return True


def _model_facts(engine) -> dict:
    st = engine.model_config.st
    vocab = engine.model_config.hf_config.get("vocab_size")
    try:
        vocab = len(engine.tokenizer.backend.get_vocab()) if vocab is None else vocab
    except Exception:
        pass
    try:
        specials = engine.tokenizer.num_special_tokens_to_add(pair=False)
    except Exception:
        specials = 0
    score_params = inspect.signature(engine.score).parameters \
        if callable(getattr(engine, "score", None)) else {}
    try:
        from pooler.server.dialects.vllm.chat import model_chat_template
        mc = engine.model_config
        chat = model_chat_template(mc.tokenizer_config, mc.path) is not None
    except Exception:
        chat = True
    return {"tasks": sorted(engine.supported_tasks),
            "default_task": getattr(engine, "default_task", None),
            "chat": chat,
            # The Engine's image side (pooler/server/media.py: takes_images).
            "images": getattr(engine, "image_side", getattr(engine, "images", None))
            is not None,
            "max_len": engine.model_config.max_model_len,
            "colbert": engine.model_config.colbert is not None,
            "scores_in_windows": _scores_in_windows(engine),
            "colbert_document_length": _colbert_document_length(engine),
            "min_truncation": specials + 1,
            "specials": specials,
            "score_directions": "truncation_direction" in score_params,
            "cross_encoder": engine.model_config.colbert is None
            and "classify" in engine.supported_tasks,
            "prompts": sorted(st.prompts) if st is not None and st.prompts else [],
            "task_adapters": list(getattr(engine, "task_adapters", None) or []),
            "dimensions": _safe_size(engine),
            "gliner": getattr(engine.model_config, "gliner", None) is not None,
            "vocab": int(vocab) if vocab else None}


def _scores_in_windows(engine) -> bool:
    """Whether score/rerank take long_input "chunk" (pooler/engine/tasks/long_scoring.py):
    not BGE-M3's combined scores, LM rerankers' prompts, page or image-text models."""
    return not (_is_bge_m3(engine)
                or getattr(engine.model_config, "rerank_prompt", None) is not None
                or getattr(engine, "images", None) is not None
                or getattr(engine, "pages", None) is not None)


def _colbert_document_length(engine) -> int | None:
    """A ColBERT document's window: its document length, at most the max length."""
    colbert = engine.model_config.colbert
    if colbert is None or not getattr(colbert, "document_length", None):
        return None
    return min(colbert.document_length, engine.model_config.max_model_len)


def _safe_size(engine) -> int | None:
    """The largest `dimensions` any task takes: the embed vector's size, or the token
    vectors' (ColBERT) when there is no embed task."""
    sizes = []
    for task in ("embed", "token_embed"):
        try:
            if task in engine.supported_tasks:
                sizes.append(engine.core.model_runner.output_size(task))
        except Exception:
            pass
    sizes = [s for s in sizes if s]
    return min(sizes) if sizes else None


def _narrow_properties(schema: dict, facts: dict) -> None:
    """Narrow the fields of `schema` and of every schema inside it (oneOf bodies, $defs)."""
    for node in list(_walk(schema)):
        _narrow_node(node, facts)
    for sub in schema.get("$defs", {}).values() if isinstance(schema, dict) else ():
        _narrow_properties(sub, facts)


def _narrow_node(schema: dict, facts: dict) -> None:
    properties = schema.get("properties", {})
    for name, prop in properties.items():
        if name == "task" and schema.get("title") == "EmbeddingRequest":
            _set_enum(prop, facts["task_adapters"])  # Jina's task: the model's adapters
        elif name == "task":
            _set_enum(prop, facts["tasks"])
        elif name == "prompt_name":
            _set_enum(prop, facts["prompts"])
        elif name == "dimensions" and not {"embed", "token_embed"} & set(facts["tasks"]):
            _set_enum(prop, [])  # only for embedding tasks: null here
        elif name in ("dimensions", "output_dimension"):
            for node in _integer_nodes(prop):
                node["minimum"] = 1
                if facts["dimensions"]:
                    node["maximum"] = facts["dimensions"]
        elif name == "chunk_aggregate" and facts["colbert"]:
            _set_enum(prop, ["max"])  # ColBERT: MaxSim over all windows' tokens
        elif name == "chunk_overlap" and "chunk_aggregate" in properties:
            # Scoring's windows hold fewer document tokens than the max length (the query's
            # take the rest, which the description states; the fuzz hooks keep to it).
            for node in _integer_nodes(prop):
                node["minimum"] = 0
                window = facts["colbert_document_length"] or facts["max_len"]
                if window:  # at most half the document tokens of a window
                    node["maximum"] = (window - facts["min_truncation"] - 1) // 2
        elif name == "long_input" and "chunk_aggregate" in properties \
                and not facts["scores_in_windows"]:
            _set_enum(prop, ["truncate"])  # see _scores_in_windows
        elif name == "max_tokens_per_doc" and facts["colbert"]:
            _set_null(prop)  # ColBERT documents keep the model's own document length
        elif name == "max_tokens_per_doc":
            # A cross-encoder cuts the document before the pair is joined; a bi-encoder
            # encodes it alone, special tokens included.
            low = 1 if facts["cross_encoder"] else facts["min_truncation"]
            for node in _integer_nodes(prop):
                node["minimum"] = max(node.get("minimum", low), low)
        elif name == "window_overlap":  # /embed_chunks: fewer tokens than a window holds
            for node in _integer_nodes(prop):
                node["minimum"] = 0
                if facts["max_len"]:
                    node["maximum"] = facts["max_len"] - facts["min_truncation"]
        elif name == "max_tokens":  # Cohere's truncate_prompt_tokens
            for node in _integer_nodes(prop):
                node["minimum"] = facts["min_truncation"]
                if facts["max_len"]:
                    node["maximum"] = facts["max_len"]
        elif name == "add_special_tokens" and not {"prompt", "inputs", "input"} & set(
                properties):
            # false leaves a blank text with no tokens at all (a 400): with no text field to
            # tie it to, the spec promises the default and true.
            properties[name] = {"anyOf": [{"type": "boolean", "enum": [True]},
                                          {"type": "null"}], "default": None}
        elif name == "content":
            # Content parts (chat messages, Cohere inputs, vLLM's {"content": [...]}): the
            # typed text parts, and image parts where the model embeds images; any other
            # object is a 400 naming the part.
            typed = ("/CohereTextContent", "/TextPart") + (
                ("/ImageURLPart",) if facts["images"] else ())
            for node in _walk(prop):
                kept = [o for o in node.get("anyOf", [])
                        if str(o.get("$ref", "")).endswith(typed)]
                if kept:
                    node["anyOf"] = kept
        elif name == "images" and not facts["images"]:
            _set_null(prop)  # Cohere's images: only for a model that embeds images
        elif name == "messages" and not facts["chat"] and not facts["images"]:
            _set_null(prop)  # no chat template in the model: chats need one
        elif name in ("document", "input"):  # /embed_chunks; vLLM refuses an empty prompt
            for node in _walk(prop):
                if node.get("type") == "string":
                    node["minLength"] = 1
                    if name == "document":  # a blank document is refused
                        node["pattern"] = _NOT_BLANK
        elif name in ("ranges", "chunks"):
            # ranges: every maximum above its minimum, per dimension of the served vector;
            # chunks: spans inside the document. JSON Schema cannot tie either to the other
            # values, so the spec shows the form that always holds: unset (server defaults).
            _set_null(prop)
        elif name == "top_n":  # 0: every document (vLLM)
            for node in _integer_nodes(prop):
                node["minimum"] = 0
        elif name == "max_batch_size":
            for node in _integer_nodes(prop):
                node["minimum"] = max(node.get("minimum", 1), 1)
        elif name == "priority":  # 0 only, unless priority scheduling is on (vllm/common.py)
            for node in _integer_nodes(prop):
                node["minimum"] = node["maximum"] = 0
        elif name == "truncate_prompt_tokens" and schema.get("title") in _NO_TRUNCATION:
            pass  # taken and ignored: any integer (or null)
        elif name == "truncate_prompt_tokens":  # -1 (the model's maximum) or a positive count
            # A scored text keeps its special tokens plus one; any other text may be cut to
            # its special tokens alone (as vLLM cuts it).
            scoring = {"query", "queries", "text_1", "data_1"} & set(properties)
            low = facts["min_truncation"] if scoring else max(1, facts["specials"])
            for node in _integer_nodes(prop):
                node.clear()
                node["anyOf"] = [{"type": "integer", "minimum": low,
                                  "maximum": facts["max_len"]},
                                 {"type": "integer", "enum": [-1]}]
        elif name == "documents":  # an object document needs its text
            for node in _walk(prop):
                if node.get("type") == "object":
                    node["required"] = sorted(set(node.get("required", [])) | {"text"})
                    node.setdefault("properties", {})["text"] = {"type": "string"}
        elif name in _QUERY_SIDES and not set(_QUERY_SIDES[name]) & set(properties):
            # 1 query x N documents (with its other side in another schema). N x N pairs are
            # accepted too, but JSON Schema cannot tie two lists' lengths, so the spec shows
            # the form that always holds (the field's description states the rule).
            for node in _array_nodes(prop):
                node["maxItems"] = 1
        if name in _NON_EMPTY:
            for node in _array_nodes(prop):
                node.setdefault("minItems", 1)
        if name in _TOKEN_ID_FIELDS and facts["vocab"]:
            for node in _integer_nodes(prop):
                node["minimum"] = 0
                node["maximum"] = facts["vocab"] - 1
    if {"aggregation_strategy", "labels"} <= set(properties):
        _narrow_ner(schema, properties, facts["gliner"], facts["max_len"])
    _one_query_when_paired(schema, properties)
    _special_tokens_need_text(schema, properties, facts["long_input"])
    # One switch under three names (normalize is use_activation on embeddings; activation is
    # use_activation's old name): those given agree (all true or all false; null is unset).
    # One anyOf of two branches: schemathesis's generator folds it, a pairwise spelling of the
    # same rule is too many branches for it.
    switch = [n for n in ("normalize", "use_activation", "activation") if n in properties]
    if len(switch) > 1:
        schema.setdefault("allOf", []).append({"anyOf": [
            {"properties": {n: {"enum": [value, None]} for n in switch}}
            for value in (True, False)]})
    # Raw (pre-activation) scores exist only for cross-encoders.
    scoring = {"query", "queries", "text_1"} & set(properties)
    if scoring and not facts["cross_encoder"]:
        if "raw_scores" in properties:
            properties["raw_scores"] = {"type": "boolean", "enum": [False], "default": False}
        for alias in ("use_activation", "activation"):
            if alias in properties:
                properties[alias] = {"anyOf": [{"type": "boolean", "enum": [True]},
                                               {"type": "null"}], "default": None}
    # Scoring without left truncation: only the default direction is promised there.
    if not facts["score_directions"] and "truncation_direction" in properties and (
            {"query", "queries", "text_1"} & set(properties)):
        _set_enum(properties["truncation_direction"], ["right", "Right"], nullable=False)
    # vLLM's score body: one of its four spellings, both sides given.
    spellings = [pair for pair in (("queries", "documents"), ("queries", "items"),
                                   ("data_1", "data_2"), ("text_1", "text_2"))
                 if set(pair) <= set(properties)]
    if "data_1" in properties and spellings:
        schema.setdefault("allOf", []).append({"anyOf": [{"required": list(pair), "properties": {
            name: {"not": {"type": "null"}} for name in pair}} for pair in spellings]})
        return
    # The score request takes queries/documents or text_1/text_2: one of each pair is needed.
    needs = [pair for pair in (("queries", "text_1"), ("documents", "text_2"),
                               ("texts", "inputs", "images") if "images" in properties
                               else ("texts", "inputs"))
             if set(pair) <= set(properties)]
    # Cohere's input_type "image" goes with images (or inputs), not with texts.
    if {"texts", "input_type", "images"} <= set(properties):
        schema.setdefault("allOf", []).append({"anyOf": [
            {"not": {"required": ["texts"]}}, {"properties": {"texts": {"type": "null"}}},
            {"properties": {"input_type": {"not": {"enum": ["image"]}}}}]})
    # Flags the handlers refuse together: add_generation_prompt and continue_final_message
    # both true; Cohere's texts and inputs both given (one kind of input per request).
    for a, b, unset in (("add_generation_prompt", "continue_final_message", {"enum": [False]}),
                        ("texts", "inputs", {"type": "null"}),
                        ("texts", "images", {"type": "null"}),
                        ("images", "inputs", {"type": "null"})):
        if {a, b} <= set(properties):
            schema.setdefault("allOf", []).append({"anyOf": [
                {"not": {"required": [a]}}, {"not": {"required": [b]}},
                {"properties": {a: unset}}, {"properties": {b: unset}}]})
    # Quantized vectors (precision other than float32) come as float lists or base64 only.
    if {"precision", "encoding_format"} <= set(properties):
        schema.setdefault("allOf", []).append({"anyOf": [
            {"not": {"required": ["precision"]}}, {"properties": {"precision": {
                "enum": ["float32"]}}},
            {"not": {"required": ["encoding_format"]}}, {"properties": {"encoding_format": {
                "enum": ["float", "base64"]}}}]})
    # /pooling quantizes vectors only: precision other than float32 needs task embed or
    # token_embed (given, or the model's default task).
    if {"precision", "task"} <= set(properties):
        vector_tasks = [t for t in facts["tasks"] if t in ("embed", "token_embed")]
        if not vector_tasks:
            _set_enum(properties["precision"], ["float32"], nullable=False)
        else:
            options = [{"not": {"required": ["precision"]}},
                       {"properties": {"precision": {"enum": ["float32"]}}},
                       {"required": ["task"], "properties": {"task": {"enum": vector_tasks}}}]
            if facts["default_task"] in vector_tasks:
                options.append({"properties": {"task": {"type": "null"}}})
            schema.setdefault("allOf", []).append({"anyOf": options})
    # /classify truncates from the right only (vLLM's classify has no truncation side).
    if "truncation_side" in properties and "input" in properties \
            and "encoding_format" not in properties:
        _set_null(properties["truncation_side"])
        if "truncation_direction" in properties:
            _set_enum(properties["truncation_direction"], ["right", "Right"], nullable=False)
    # A text or a chat, never both.
    for pair in (("input", "messages"), ("prompt", "messages")):
        if set(pair) <= set(properties):
            schema.setdefault("allOf", []).append({"oneOf": [{"required": [name], "properties": {
                name: {"not": {"type": "null"}}}} for name in pair]})
    if needs:
        schema.setdefault("allOf", []).extend([{"anyOf": [{"required": [name], "properties": {
            name: {"not": {"type": "null"}}}} for name in pair]} for pair in needs])


def _one_query_when_paired(schema: dict, properties: dict) -> None:
    """A score body's query side holds one query whenever a field it pairs with is given
    (1 x N; N x N is served too but JSON Schema cannot tie the lengths). A query side whose
    pair is absent or null is not scored, and any list of texts is taken there."""
    for side, partners in _QUERY_SIDES.items():
        for partner in partners:
            if {side, partner} <= set(properties):
                schema.setdefault("allOf", []).append({"anyOf": [
                    {"not": {"required": [partner]}},
                    {"properties": {partner: {"type": "null"}}},
                    {"properties": {side: {"not": {"type": "array", "minItems": 2}}}}]})


def _special_tokens_need_text(schema: dict, properties: dict, long_input: str) -> None:
    """add_special_tokens false with a text that has no tokens of its own (blank) is a 400,
    as in vLLM: the spec takes false with texts that always have a token (a printable ASCII
    character each; token ids and chats as they are). long_input "chunk" puts the special
    tokens around every window: it refuses false."""
    if not {"add_special_tokens", "input"} <= set(properties):
        return
    texts = copy.deepcopy(properties["input"])
    for node in _walk(texts):
        if node.get("type") == "string":
            node["pattern"] = _HAS_A_TOKEN
    without = {"input": {"anyOf": [texts, {"type": "null"}]}}
    if "long_input" in properties:
        without["long_input"] = {"enum": ["truncate"]} if long_input == "chunk" \
            else {"enum": ["truncate", None]}
    takes_false = {"properties": without}
    if "long_input" in properties and long_input == "chunk":  # unset means chunk there
        takes_false["required"] = ["long_input"]
    schema.setdefault("allOf", []).append({"anyOf": [
        {"properties": {"add_special_tokens": {"enum": [True, None]}}}, takes_false]})


def _narrow_ner(schema: dict, properties: dict, gliner: bool, max_len: int | None) -> None:
    """/ner: a GLiNER model needs `labels` (non-blank strings; one list per input is accepted
    too, but its length cannot be tied to the inputs', so the spec shows the shared form) and
    refuses the token-classification options; any other model refuses the GLiNER ones.
    The label prompt must fit the model's tokens: the spec promises label lists that always
    do (up to 50 characters each, one label per 60 tokens of the limit), more may fit."""
    if not gliner:
        for name in ("labels", "threshold", "flat_ner", "multi_label"):
            if name in properties:
                _set_null(properties[name])
        return
    description = properties["labels"].get("description")
    # Blank labels are refused.
    properties["labels"] = {"type": "array", "minItems": 1, "description": description,
                            "maxItems": max(1, ((max_len or 2048) - 1) // _TOKENS_PER_LABEL),
                            "items": {"type": "string", "maxLength": _LABEL_CHARS,
                                      "pattern": _NOT_BLANK}}
    schema["required"] = sorted(set(schema.get("required", [])) | {"labels"})
    _set_enum(properties["aggregation_strategy"], ["simple"], nullable=False)
    _set_null(properties["ignore_labels"])
    if "truncate_prompt_tokens" in properties:  # -1 (the model's maximum) only
        properties["truncate_prompt_tokens"] = {"anyOf": [{"type": "integer", "enum": [-1]},
                                                          {"type": "null"}], "default": None}
    if "truncation_direction" in properties:
        _set_enum(properties["truncation_direction"], ["right", "Right"], nullable=False)


def _set_null(prop: dict) -> None:
    """A field this model only takes as null (or absent)."""
    for key in ("anyOf", "type", "enum", "oneOf", "$ref", "items", "minItems"):
        prop.pop(key, None)
    prop["type"] = "null"


def _set_enum(prop: dict, values: list[str], nullable: bool = True) -> None:
    """A string(-or-null) field that only takes `values` (only null when there are none)."""
    options = [{"type": "string", "enum": values}] if values else []
    if not nullable:
        for key in ("anyOf", "type", "enum", "oneOf", "$ref"):
            prop.pop(key, None)
        prop.update(options[0])
        return
    has_default = "default" in prop
    default = prop.get("default")
    for key in ("anyOf", "type", "enum", "oneOf"):
        prop.pop(key, None)
    prop["anyOf"] = options + [{"type": "null"}]
    if has_default:
        prop["default"] = default


def _walk(node: Any):
    if isinstance(node, dict):
        yield node
        for key in ("anyOf", "oneOf", "allOf"):
            for child in node.get(key, []):
                yield from _walk(child)
        if "items" in node:
            yield from _walk(node["items"])
        if isinstance(node.get("prefixItems"), list):
            for child in node["prefixItems"]:
                yield from _walk(child)


def _integer_nodes(prop: dict):
    return [n for n in _walk(prop) if n.get("type") == "integer"]


def _array_nodes(prop: dict):
    return [n for n in _walk(prop) if n.get("type") == "array"]
