"""Request and response bodies of every route, as pydantic models.

Unknown fields are ignored (clients of other servers send extras such as `input_type`), but
every known field is strictly typed: "1" is not a token id and 1 is not a text.
Responses are declared for the OpenAPI spec; handlers serialize them in a worker thread.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictStr


def _json_integer(value: Any) -> Any:
    """JSON Schema's integer, as clients and fuzzers send it: 5 and 5.0, never "5" or true."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("Input should be a valid integer")
    return value


# Strict but for integral floats (JSON Schema counts 108.0 as an integer; pydantic's StrictInt
# refused it, a schema-valid request rejected).
StrictInt = Annotated[int, BeforeValidator(_json_integer)]

# One or many texts, or one or many token-id lists (OpenAI's `input`).
Inputs = Union[StrictStr, list[StrictStr], list[StrictInt], list[list[StrictInt]]]
TextInputs = Union[StrictStr, list[StrictStr]]


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _TruncationFields(_Request):
    """pooler/vLLM truncation options. Over-long inputs are cut to the model's maximum by
    default, as the offline API and sentence-transformers do."""
    truncate: StrictBool = True
    truncate_prompt_tokens: Optional[StrictInt] = Field(
        None, description="cut inputs to this many tokens; -1 means the model's maximum")
    truncation_direction: Literal["right", "left", "Right", "Left"] = "right"


# ---- errors ---------------------------------------------------------------------------------
class ErrorInfo(BaseModel):
    message: str
    type: str
    param: Optional[str] = None
    code: Optional[str] = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


# ---- OpenAI ---------------------------------------------------------------------------------
class EmbeddingRequest(_TruncationFields):
    input: Inputs
    model: Optional[StrictStr] = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Optional[StrictInt] = None
    user: Optional[StrictStr] = None
    normalize: Optional[StrictBool] = None
    prompt_name: Optional[StrictStr] = None


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: Union[list[float], str]


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "pooler"
    root: str
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# ---- vLLM -----------------------------------------------------------------------------------
class PoolingRequest(_TruncationFields):
    input: Inputs
    model: Optional[StrictStr] = None
    task: Optional[Literal["embed", "classify", "token_embed", "token_classify"]] = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Optional[StrictInt] = None
    normalize: Optional[StrictBool] = None
    use_activation: Optional[StrictBool] = None
    user: Optional[StrictStr] = None


class PoolingData(BaseModel):
    object: Literal["pooling"] = "pooling"
    index: int
    data: Union[list[float], list[list[float]], str]


class PoolingResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[PoolingData]
    usage: Usage


class ClassificationRequest(_TruncationFields):
    input: Inputs
    model: Optional[StrictStr] = None
    use_activation: Optional[StrictBool] = None
    user: Optional[StrictStr] = None


class ClassificationData(BaseModel):
    object: Literal["classification"] = "classification"
    index: int
    label: Optional[str]
    probs: list[float]
    num_classes: int


class ClassificationResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[ClassificationData]
    usage: Usage


class ScoreRequest(_Request):
    """Either queries/documents or vLLM's older text_1/text_2: one query against one or many
    documents, or N queries paired with N documents."""
    model: Optional[StrictStr] = None
    queries: Optional[TextInputs] = None
    documents: Optional[TextInputs] = None
    text_1: Optional[TextInputs] = None
    text_2: Optional[TextInputs] = None
    user: Optional[StrictStr] = None


class ScoreData(BaseModel):
    object: Literal["score"] = "score"
    index: int
    score: float


class ScoreResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[ScoreData]
    usage: Usage


class TokenizeRequest(_Request):
    """vLLM's /tokenize (TEI's has `inputs` instead of `prompt`)."""
    prompt: StrictStr
    model: Optional[StrictStr] = None
    add_special_tokens: StrictBool = True
    return_token_strs: StrictBool = False


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: Optional[list[str]] = None


class DetokenizeRequest(_Request):
    tokens: list[StrictInt]
    model: Optional[StrictStr] = None


class DetokenizeResponse(BaseModel):
    prompt: str


# ---- Cohere / Jina / vLLM rerank ------------------------------------------------------------
class RerankRequest(_Request):
    query: StrictStr
    documents: list[Union[StrictStr, dict[str, Any]]]
    model: Optional[StrictStr] = None
    top_n: Optional[StrictInt] = None
    return_documents: StrictBool = False


class RerankDocument(BaseModel):
    text: str


class RerankResultItem(BaseModel):
    index: int
    relevance_score: float
    document: Optional[RerankDocument] = None


class RerankUsage(BaseModel):
    total_tokens: Optional[int] = None


class RerankResponse(BaseModel):
    id: str
    model: str
    results: list[RerankResultItem]
    usage: RerankUsage


# ---- TEI ------------------------------------------------------------------------------------
TEIDirection = Literal["right", "left", "Right", "Left"]


class TEIEmbedRequest(_Request):
    """TEI's defaults: normalize=true, truncate=false (over-long input is an error)."""
    inputs: Inputs
    normalize: StrictBool = True
    truncate: Optional[StrictBool] = False
    truncation_direction: TEIDirection = "right"
    prompt_name: Optional[StrictStr] = None
    dimensions: Optional[StrictInt] = None


class TEIEmbedAllRequest(_Request):
    inputs: Inputs
    truncate: Optional[StrictBool] = False
    truncation_direction: TEIDirection = "right"
    prompt_name: Optional[StrictStr] = None


class TEIRerankRequest(_Request):
    query: StrictStr
    texts: list[StrictStr]
    raw_scores: StrictBool = False
    return_text: StrictBool = False
    truncate: Optional[StrictBool] = False
    truncation_direction: TEIDirection = "right"


class TEIRank(BaseModel):
    index: int
    score: float
    text: Optional[str] = None


class TEIPredictRequest(_Request):
    """A text, a [text, text_pair] pair, or a list of either."""
    inputs: Union[StrictStr, list[StrictStr],
                  list[Annotated[list[StrictStr], Field(min_length=2, max_length=2)]]]
    raw_scores: StrictBool = False
    truncate: Optional[StrictBool] = False
    truncation_direction: TEIDirection = "right"


class TEILabelScore(BaseModel):
    label: str
    score: float


class TEISparseRequest(_Request):
    inputs: TextInputs
    truncate: Optional[StrictBool] = False
    truncation_direction: TEIDirection = "right"
    prompt_name: Optional[StrictStr] = None


class TEISparseValue(BaseModel):
    index: int
    value: float


class TEITokenizeRequest(_Request):
    inputs: TextInputs
    add_special_tokens: StrictBool = True
    prompt_name: Optional[StrictStr] = None


class TEISimpleToken(BaseModel):
    id: int
    text: str
    special: bool
    start: Optional[int]
    stop: Optional[int]


class TEIDecodeRequest(_Request):
    ids: Union[list[StrictInt], list[list[StrictInt]]]
    skip_special_tokens: StrictBool = True


# ---- pooler's own ---------------------------------------------------------------------------
class NERRequest(_TruncationFields):
    input: TextInputs
    model: Optional[StrictStr] = None
    aggregation_strategy: Literal["none", "simple", "first", "average", "max"] = "simple"
    ignore_labels: Optional[list[StrictStr]] = None


class NEREntity(BaseModel):
    entity_group: Optional[str] = None
    entity: Optional[str] = None
    score: float
    word: str
    start: Optional[int]
    end: Optional[int]


class NERData(BaseModel):
    object: Literal["entities"] = "entities"
    index: int
    entities: list[NEREntity]


class NERResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[NERData]


class InfoResponse(BaseModel):
    model_id: str
    model_path: str
    model_dtype: str
    architecture: str
    tasks: list[str]
    default_task: str
    embedding_dimensions: Optional[int]
    max_input_length: int
    max_batch_tokens: int
    max_batch_requests: int
    max_client_batch_size: int
    max_payload_bytes: int
    max_queue: int
    version: str
