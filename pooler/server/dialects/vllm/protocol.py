"""Request and response bodies of vLLM's pooling routes, field for field as vLLM's published
protocol (vllm/entrypoints/pooling/*/protocol.py, serve/tokenize), plus pooler's own options
(normalize, prompt_name, truncate, truncation_direction).

Unknown fields are ignored, as vLLM ignores them. Known fields are strictly typed; enumerated
ones are Literals, so a bad value is a 400 naming the field and the value.
"""
from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, model_validator

from pooler.server.dialects.vllm.encoding import EmbedDType, EncodingFormat, Endianness
from pooler.server.protocol import (ContentPart, Inputs, Precision, StrictInt,  # JSON integers
                                    _TruncationFields)


class FieldError(ValueError):
    """A validator's error about one field: the error body names it in `param` (vLLM's
    VLLMValidationError.parameter)."""

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.field = field


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: StrictStr
    content: Union[StrictStr, list[ContentPart], None] = None


class _VLLMRequest(_TruncationFields):
    """What every vLLM pooling request takes."""
    model: Optional[StrictStr] = None
    user: Optional[StrictStr] = None
    request_id: Optional[StrictStr] = None
    priority: StrictInt = 0
    truncation_side: Optional[Literal["left", "right"]] = None  # vLLM's truncation_direction


def _is_chat(value: Any) -> bool:
    return (isinstance(value, list) and bool(value)
            and all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in value))


class _InputOrChat(_VLLMRequest):
    """`input` (texts or token ids) or `messages`: one chat, or a list of chats (a batch),
    each rendered with the chat template. As in vLLM, a chat (or a list of chats) may also
    come in `input`, and add_special_tokens defaults to true for input, false for chats."""
    input: Optional[Inputs] = None
    messages: Optional[Union[list[ChatMessage], list[list[ChatMessage]]]] = None

    @model_validator(mode="before")
    @classmethod
    def _chat_in_input(cls, data):
        if isinstance(data, dict) and "messages" not in data:
            value = data.get("input")
            if _is_chat(value) or (isinstance(value, list) and value
                                   and all(_is_chat(v) for v in value)):
                data = {k: v for k, v in data.items() if k != "input"}
                data["messages"] = value
        return data

    def conversations(self) -> list[list[ChatMessage]]:
        if self.messages and isinstance(self.messages[0], list):
            return list(self.messages)
        return [self.messages]
    add_special_tokens: Optional[StrictBool] = None
    add_generation_prompt: StrictBool = False
    continue_final_message: StrictBool = False
    chat_template: Optional[StrictStr] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None
    tools: Optional[list[dict[str, Any]]] = None  # in the template's scope, as transformers

    @model_validator(mode="after")
    def _one_input(self):
        if self.input is None and self.messages is None:
            raise FieldError("Missing required field 'input' (texts or token ids); or pass "
                             "'messages' (a chat) instead.", "input")
        if self.input is not None and self.messages is not None:
            raise FieldError("Pass either 'input' or 'messages', not both.", "messages")
        if self.messages is not None and (not self.messages or
                                          any(not chat for chat in self.conversations())):
            raise FieldError("messages is empty: pass at least one message per chat.",
                             "messages")
        if self.continue_final_message and self.add_generation_prompt:
            raise FieldError("Cannot set both `continue_final_message` and "
                             "`add_generation_prompt` to True.", "continue_final_message")
        return self


class _ActivationAlias(BaseModel):
    """`activation`: vLLM's earlier name of use_activation, honoured as it."""
    use_activation: Optional[StrictBool] = None
    activation: Optional[StrictBool] = Field(
        None, description="deprecated name of use_activation (vLLM < 0.11)")

    @model_validator(mode="after")
    def _activation_is_use_activation(self):
        if self.activation is not None:
            if self.use_activation is not None and self.use_activation != self.activation:
                raise FieldError("'activation' is the old name of 'use_activation' and the two "
                                 "disagree; pass only 'use_activation'.", "activation")
            self.use_activation = self.activation
        return self


class _Encoding(BaseModel):
    encoding_format: EncodingFormat = "float"
    embed_dtype: EmbedDType = "float32"
    endianness: Endianness = "native"


class EmbeddingRequest(_InputOrChat, _Encoding, _ActivationAlias):
    dimensions: Optional[StrictInt] = None
    normalize: Optional[StrictBool] = None  # pooler's name for use_activation on embeddings
    prompt_name: Optional[StrictStr] = None
    # pooler's addition (issue 16): quantized vectors, see pooler/server/dialects/quantized.py
    precision: Precision = "float32"
    ranges: Optional[list[list[float]]] = None
    # pooler's addition (issue 16): "chunk" embeds an over-long input window by window
    # (Engine.embed long_input); unset follows the server's --long-input.
    long_input: Optional[Literal["truncate", "chunk"]] = None
    chunk_overlap: StrictInt = 0
    # Jina's embeddings API: one of the task adapters the model carries (jina-embeddings-v3:
    # retrieval.query, retrieval.passage, separation, classification, text-matching).
    task: Optional[StrictStr] = Field(None, description=(
        "A task adapter of the model (GET /v1/models lists them), as Jina's API takes it: "
        "the adapter, and the task's instruction from the model's config unless "
        "prompt_name is given."))

    @model_validator(mode="after")
    def _one_normalize_switch(self):
        # On embeddings use_activation (or its old name, activation) is the normalization.
        if None not in (self.normalize, self.use_activation) \
                and self.normalize != self.use_activation:
            raise FieldError(f"normalize={self.normalize} and use_activation (or activation)="
                             f"{self.use_activation} disagree; for embeddings they are the "
                             "same switch, pass one of them.", "normalize")
        return self


class PoolingRequest(_InputOrChat, _Encoding, _ActivationAlias):
    # A string, not a Literal: an unknown task is vLLM's "Unsupported task: ..." error.
    task: Optional[StrictStr] = None
    dimensions: Optional[StrictInt] = None
    normalize: Optional[StrictBool] = None
    # pooler's addition (issue 16): quantized vectors for embed / token_embed
    precision: Precision = "float32"
    ranges: Optional[list[list[float]]] = None


class ClassificationRequest(_InputOrChat, _ActivationAlias):
    pass


class _LongDocuments(BaseModel):
    """pooler's addition: long documents scored in windows (Engine.score long_input), for
    every scoring body (vLLM's, Cohere's, Jina's, TEI's)."""
    long_input: Optional[Literal["truncate", "chunk"]] = Field(None, description=(
        "\"chunk\": a document longer than the model takes is scored in windows (each fits "
        "beside the query) instead of being cut or refused; each result then carries "
        "num_windows. Unset: \"truncate\"."))
    chunk_overlap: Optional[StrictInt] = Field(None, ge=0, description=(
        "Document tokens consecutive windows share; unset: a quarter of a window. At most "
        "half the document tokens a window holds: on a cross-encoder the max length less the "
        "query's tokens and the special tokens."))
    chunk_aggregate: Optional[Literal["max", "mean"]] = Field(None, description=(
        "How a document's window scores combine: \"max\" (the best window, MaxP; the "
        "default) or \"mean\". ColBERT models score MaxSim over all windows' tokens."))


class ScoreMultiModal(BaseModel):
    """vLLM's ScoreMultiModalParam: one query or document as content parts, text
    ({"type": "text", "text": ...}) and image ({"type": "image_url", "image_url": {"url":
    ...}}) parts; on an image-text model one image part is the image, text parts the text."""
    model_config = ConfigDict(extra="ignore")
    content: list[ContentPart]


# A side of /score: a text, a ScoreMultiModalParam, or a list of either (vLLM's ScoreInputs).
ScoreInputs = Union[StrictStr, ScoreMultiModal, list[Union[StrictStr, ScoreMultiModal]]]


def _side_length(value) -> int:
    return len(value) if isinstance(value, list) else 1


class _Scoring(_VLLMRequest, _ActivationAlias, _LongDocuments):
    max_tokens_per_doc: Optional[StrictInt] = None
    # None: an over-long pair is an error unless truncate_prompt_tokens is given (vLLM).
    truncate: Optional[StrictBool] = None


# The rule JSON Schema cannot state (it cannot tie two lists' lengths): the spec shows the one
# query form whenever the other side is given; N:N is served too, N:M (N > 1, N != M) is a 400.
_QUERY_SIDE = ("One query (a string or a one-item list) scored against every text of the other "
               "side, or N queries scored pairwise against exactly N texts there. N queries with "
               "a different number of texts on the other side is a 400 naming that field.")


class ScoreRequest(_Scoring):
    """vLLM's four spellings of the two sides: queries/documents, queries/items,
    data_1/data_2, text_1/text_2."""
    queries: Optional[ScoreInputs] = Field(None, description=_QUERY_SIDE)
    documents: Optional[ScoreInputs] = None
    items: Optional[ScoreInputs] = None
    data_1: Optional[ScoreInputs] = Field(None, description=_QUERY_SIDE)
    data_2: Optional[ScoreInputs] = None
    text_1: Optional[ScoreInputs] = Field(None, description=_QUERY_SIDE)
    text_2: Optional[ScoreInputs] = None

    @model_validator(mode="after")
    def _one_spelling(self):
        for name in ("queries", "documents", "items", "data_1", "data_2", "text_1", "text_2"):
            if getattr(self, name) == []:  # refused even when another spelling is used
                raise FieldError(f"'{name}' is empty: pass at least one text, or leave it "
                                 "out.", name)
        given = [(a, b) for a, b in (("queries", "documents"), ("queries", "items"),
                                     ("data_1", "data_2"), ("text_1", "text_2"))
                 if getattr(self, a) is not None and getattr(self, b) is not None]
        if not given:
            raise FieldError("Missing required fields: pass the two sides as 'queries' and "
                             "'documents' (or queries/items, data_1/data_2, text_1/text_2).",
                             "documents")
        # 1:1, 1:N or N:N (vLLM), checked for every spelling given, not only the one scored:
        # a second pair is never silently dropped when it could not have been scored.
        for a, b in given:
            n_a, n_b = (_side_length(v) for v in (getattr(self, a), getattr(self, b)))
            if n_a > 1 and n_a != n_b:
                raise FieldError(f"Got {n_a} {a} and {n_b} {b}: pass one query with any number "
                                 f"of {b}, or as many {a} as {b} (scored pairwise).", b)
        return self

    def sides(self):
        for a, b in (("queries", "documents"), ("queries", "items"), ("data_1", "data_2"),
                     ("text_1", "text_2")):
            if getattr(self, a) is not None and getattr(self, b) is not None:
                return getattr(self, a), getattr(self, b), b
        raise AssertionError("validated above")


class RerankRequest(_Scoring):
    """vLLM's, Jina's and Cohere's rerank body. top_n 0 (the default) means every document."""
    query: Union[StrictStr, ScoreMultiModal]
    # Strings, Cohere v1's {"text": ...} objects, or vLLM's {"content": [parts]} (one document
    # each; a single {"content": ...} is one document).
    documents: Union[StrictStr, ScoreMultiModal,
                     list[Union[StrictStr, ScoreMultiModal, dict[str, Any]]]]
    top_n: StrictInt = Field(0, ge=0)
    return_documents: Optional[StrictBool] = None  # Cohere/Jina; vLLM always returns them


class TokenizeRequest(_VLLMRequest):
    """vLLM's /tokenize: `prompt` or `messages` (TEI's body has `inputs` instead)."""
    prompt: Optional[StrictStr] = None
    messages: Optional[list[ChatMessage]] = None
    add_special_tokens: Optional[StrictBool] = None
    add_generation_prompt: StrictBool = False
    continue_final_message: StrictBool = False
    chat_template: Optional[StrictStr] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None
    tools: Optional[list[dict[str, Any]]] = None  # in the template's scope, as transformers
    return_token_strs: StrictBool = False

    @model_validator(mode="after")
    def _one_input(self):
        if self.messages is not None and not self.messages:
            raise FieldError("messages is empty: pass at least one message.", "messages")
        if self.prompt is None and self.messages is None:
            raise FieldError("Missing required field 'prompt'; or pass 'messages' (a chat) "
                             "instead.", "prompt")
        if self.prompt is not None and self.messages is not None:
            raise FieldError("Pass either 'prompt' or 'messages', not both.", "messages")
        if self.continue_final_message and self.add_generation_prompt:
            raise FieldError("Cannot set both `continue_final_message` and "
                             "`add_generation_prompt` to True.", "continue_final_message")
        return self


class DetokenizeRequest(_VLLMRequest):
    tokens: list[StrictInt]


# ---- responses (for the OpenAPI spec; handlers build plain dicts) ------------------------------
class UsageInfo(BaseModel):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: Optional[int] = 0


class EmbeddingData(BaseModel):
    index: int
    object: str = "embedding"
    embedding: Union[list[float], str]


class EmbeddingResponse(BaseModel):
    id: str
    object: str = "list"
    created: int
    model: str
    data: list[EmbeddingData]
    usage: UsageInfo


class PoolingData(BaseModel):
    index: int
    object: str = "pooling"
    data: Union[list[list[float]], list[float], str]


class PoolingResponse(BaseModel):
    id: str
    object: str = "list"
    created: int
    model: str
    data: list[PoolingData]
    usage: UsageInfo


class ClassificationData(BaseModel):
    index: int
    label: Optional[str]
    probs: list[float]
    num_classes: int


class ClassificationResponse(BaseModel):
    id: str
    object: str = "list"
    created: int
    model: str
    data: list[ClassificationData]
    usage: UsageInfo


class ScoreData(BaseModel):
    index: int
    object: str = "score"
    score: float
    # pooler's addition: the windows the document was scored in (long_input "chunk" only)
    num_windows: Optional[int] = None


class ScoreResponse(BaseModel):
    id: str
    object: str = "list"
    created: int
    model: str
    data: list[ScoreData]
    usage: UsageInfo


class RerankDocument(BaseModel):
    text: Optional[str] = None
    multi_modal: Optional[list[dict[str, Any]]] = None  # a {"content": [...]} document's parts


class RerankResult(BaseModel):
    index: int
    document: Optional[RerankDocument] = None  # left out only when return_documents=false
    relevance_score: float
    # pooler's addition: the windows the document was scored in (long_input "chunk" only)
    num_windows: Optional[int] = None


class RerankUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class RerankResponse(BaseModel):
    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: Optional[list[str]] = None


class DetokenizeResponse(BaseModel):
    prompt: str
