"""Request and response bodies of every route, as pydantic models.

Unknown fields are ignored (clients of other servers send extras such as `input_type`), but
every known field is strictly typed: "1" is not a token id and 1 is not a text.
Responses are declared for the OpenAPI spec; handlers serialize them in a worker thread.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictStr,
                      model_validator)


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
# pooler's quantized outputs (issue 16), on /v1/embeddings and /embed.
Precision = Literal["float32", "int8", "uint8", "binary", "ubinary"]


def drop_nulls(cls: type[BaseModel], data: Any) -> Any:
    """An explicit null for an optional field means the field is unset (its default), as
    OpenAI's and vLLM's clients send it ("top_n": null); a required field stays required."""
    if isinstance(data, dict):
        fields = cls.model_fields
        return {k: v for k, v in data.items()
                if not (v is None and k in fields and not fields[k].is_required())}
    return data


class NullMeansUnset(BaseModel):
    """Request bodies: null for an optional field is its default (drop_nulls)."""

    @model_validator(mode="before")
    @classmethod
    def _null_means_unset(cls, data):
        return drop_nulls(cls, data)


class _Request(NullMeansUnset):
    model_config = ConfigDict(extra="ignore")


class _TruncationFields(_Request):
    """pooler/vLLM truncation options. Over-long inputs are cut to the model's maximum by
    default, as the offline API and sentence-transformers do."""
    truncate: StrictBool = True
    truncate_prompt_tokens: Optional[StrictInt] = Field(
        None, description="cut inputs to this many tokens; -1 means the model's maximum")
    truncation_direction: Literal["right", "left", "Right", "Left"] = "right"


# ---- content parts (images; pooler/server/media.py) -------------------------------------------
_IMAGE_URL = ("A data:image/<type>;base64,... URL; http(s):// URLs and file:// URLs as the "
              "server's media flags allow (--allow-private-media-urls, "
              "--allowed-local-media-path).")


class TextPart(_Request):
    """{"type": "text", "text": ...} (OpenAI's chat content part)."""
    type: Literal["text"]
    text: StrictStr


class ImageURL(_Request):
    url: StrictStr = Field(description=_IMAGE_URL)


class ImageURLPart(_Request):
    """{"type": "image_url", "image_url": {"url": ...}}: on a model that embeds images (CLIP,
    SigLIP) the image; a text-only model answers 400 naming the part."""
    type: Literal["image_url"]
    image_url: Union[ImageURL, StrictStr]


# A content part: typed text and image parts (what the spec declares), or any other object,
# which the handlers refuse with a 400 naming the part and the forms taken.
ContentPart = Union[TextPart, ImageURLPart, dict[str, Any]]


def part_dicts(parts: list) -> list[dict]:
    """Content parts as plain dicts (the typed ones dumped), as handlers read them."""
    return [p.model_dump(exclude_none=True) if isinstance(p, BaseModel) else p for p in parts]


# ---- errors ---------------------------------------------------------------------------------
class ErrorInfo(BaseModel):
    message: str
    type: str
    param: Optional[str] = None
    code: Optional[str] = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


# ---- OpenAI ---------------------------------------------------------------------------------
class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "pooler"
    root: str
    max_model_len: int
    parent: Optional[str] = None  # a LoRA adapter's base model (vLLM's field)


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# ---- TEI ------------------------------------------------------------------------------------
TEIDirection = Literal["right", "left", "Right", "Left"]


# TEI's Input: one text or token-id list, or a batch of them, texts and id lists mixed.
TEIInputs = Union[StrictStr, list[StrictInt], list[Union[StrictStr, list[StrictInt]]]]


class _TEITruncation(_Request):
    """TEI >= 1.9: `truncate` unset means the server's auto-truncate (on); false makes an
    over-long input a 422."""
    truncate: Optional[StrictBool] = None
    truncation_direction: TEIDirection = "right"


class TEIEmbedRequest(_TEITruncation):
    inputs: TEIInputs
    normalize: StrictBool = True
    prompt_name: Optional[StrictStr] = None
    dimensions: Optional[StrictInt] = None
    precision: Precision = Field("float32", description="pooler's addition: int8, uint8, "
                                 "binary or ubinary vectors (see README, quantized outputs)")
    ranges: Optional[list[list[float]]] = Field(
        None, description="int8/uint8: [[min per dimension], [max per dimension]]; default "
        "[-1, 1] in every dimension")


class TEIEmbedAllRequest(_TEITruncation):
    inputs: TEIInputs
    prompt_name: Optional[StrictStr] = None


class TEIRerankRequest(_TEITruncation):
    query: StrictStr
    texts: list[StrictStr]
    raw_scores: StrictBool = False
    return_text: StrictBool = False
    # pooler's addition: long texts scored in windows (Engine.rerank long_input)
    long_input: Optional[Literal["truncate", "chunk"]] = None
    chunk_overlap: Optional[StrictInt] = Field(None, ge=0)
    chunk_aggregate: Optional[Literal["max", "mean"]] = None


class TEIRank(BaseModel):
    index: int
    score: float
    text: Optional[str] = None
    num_windows: Optional[int] = None  # pooler's addition: long_input "chunk" only


class TEIPredictRequest(_TEITruncation):
    """A text, [text], [text, text_pair], or a batch [[text], [text, text_pair], ...]."""
    inputs: Union[StrictStr,
                  list[Union[StrictStr,
                             Annotated[list[StrictStr], Field(min_length=1, max_length=2)]]]]
    raw_scores: StrictBool = False


class TEILabelScore(BaseModel):
    label: str
    score: float


class TEISparseRequest(_TEITruncation):
    inputs: TEIInputs
    prompt_name: Optional[StrictStr] = None


class TEISparseValue(BaseModel):
    index: int
    value: float


class TEISimilarityInput(_Request):
    source_sentence: StrictStr
    sentences: list[StrictStr]


class TEISimilarityParameters(_TEITruncation):
    prompt_name: Optional[StrictStr] = None


class TEISimilarityRequest(_Request):
    inputs: TEISimilarityInput
    parameters: TEISimilarityParameters = Field(default_factory=TEISimilarityParameters)


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
    # GLiNER (zero-shot) models only: the entity types to find, one list for every input or
    # one list per input, and how spans are kept (pooler/gliner.py).
    labels: Optional[Union[list[StrictStr], list[list[StrictStr]]]] = Field(
        None, description="GLiNER models: entity types to find, e.g. ['person', 'company']")
    threshold: Optional[float] = Field(None, gt=0, le=1, strict=True,
                                       description="GLiNER models: keep spans scoring above "
                                       "this (default 0.5)")
    flat_ner: Optional[StrictBool] = Field(None, description="GLiNER models: no overlapping "
                                           "entities (default true); false allows nesting")
    multi_label: Optional[StrictBool] = Field(None, description="GLiNER models: one span may "
                                              "carry several labels (default false)")


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
    """TEI's Info fields (its python client reads them), then pooler's own."""
    model_id: str
    model_sha: Optional[str] = None
    served_model_name: str
    model_type: dict[str, Any]
    max_concurrent_requests: int
    auto_truncate: bool
    tokenization_workers: int
    sha: Optional[str] = None
    docker_label: Optional[str] = None
    model_path: Optional[str] = None  # the folder, with --show-model-path only
    model_dtype: str
    architecture: str
    tasks: list[str]
    default_task: str
    embedding_dimensions: Optional[int]
    max_input_length: int
    max_batch_tokens: int
    max_batch_requests: Optional[int]
    max_client_batch_size: int
    max_payload_bytes: int
    max_queue: int
    version: str
