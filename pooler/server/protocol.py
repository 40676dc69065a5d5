"""Request and response bodies of every route, as pydantic models.

Unknown fields are ignored (clients of other servers send extras such as `input_type`), but
every known field is strictly typed: "1" is not a token id and 1 is not a text.
Responses are declared for the OpenAPI spec; handlers serialize them in a worker thread.
"""
from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

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


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


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
    inputs: Union[StrictStr, list[StrictStr], list[list[StrictStr]]]
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
