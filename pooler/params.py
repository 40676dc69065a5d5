"""Per-request pooling parameters; `verify()` checks them against the model and fills defaults."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from pooler.tasks import check_task

if TYPE_CHECKING:
    from pooler.config import ModelConfig

LATE_INTERACTION_MODES = ("cache_query", "score_doc")


@dataclass
class LateInteractionParams:
    """ColBERT scoring role of a request: cache a query, or score a doc against a cached one."""
    mode: str
    query_key: str
    query_uses: int | None = None  # cache_query only; None means 1

    def __post_init__(self):
        self.verify()

    def verify(self) -> None:
        if self.mode not in LATE_INTERACTION_MODES:
            raise ValueError(f"late_interaction.mode must be one of "
                             f"{list(LATE_INTERACTION_MODES)}, got {self.mode!r}.")
        if not isinstance(self.query_key, str) or not self.query_key:
            raise ValueError("late_interaction.query_key must be a non-empty string.")
        if self.mode == "cache_query":
            uses = 1 if self.query_uses is None else self.query_uses
            if isinstance(uses, bool) or not isinstance(uses, int):
                raise ValueError("late_interaction.query_uses must be an integer, "
                                 f"got {self.query_uses!r}.")
            self.query_uses = max(1, uses)


@dataclass
class PoolingParams:
    """What to compute for one request.

    task: which pooling task; None takes the model's selected task.
    dimensions: Matryoshka truncation of an embedding (re-normalized when `normalize`).
    normalize: L2-normalize embeddings; None follows the model (sentence-transformers Normalize).
    use_activation: apply the classifier's activation (softmax/sigmoid); False gives raw logits.
        On embed tasks it is the L2 normalization (as vLLM), i.e. the same switch as normalize.
    skip_special_tokens: token tasks only; drop [CLS]/[SEP]-like positions from the output.
    lora: the LoRA adapter to run the request with (a name the engine serves); None: the base.
    """
    task: str | None = None
    dimensions: int | None = None
    normalize: bool | None = None
    use_activation: bool | None = None
    skip_special_tokens: bool = False
    late_interaction: LateInteractionParams | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    lora: str | None = None

    def clone(self) -> "PoolingParams":
        return replace(self, extra=dict(self.extra))

    def verify(self, model_config: "ModelConfig", default_task: str) -> "PoolingParams":
        """Return a copy with the task and model defaults filled in; raise ValueError on misuse."""
        params = self.clone()
        params.task = check_task(params.task or default_task)
        if params.dimensions is not None:
            if params.task not in ("embed", "token_embed"):
                raise ValueError(f"dimensions is only valid for embed tasks, not {params.task!r}.")
            if isinstance(params.dimensions, bool) or not isinstance(params.dimensions, int) \
                    or params.dimensions <= 0:
                raise ValueError(
                    f"dimensions must be a positive integer, got {params.dimensions!r}.")
        if params.task in ("embed", "token_embed") and params.use_activation is not None:
            # vLLM's name for an embedding's activation is use_activation: it is the L2
            # normalization, so it sets `normalize` (they must agree when both are given).
            if params.normalize is not None and params.normalize != params.use_activation:
                raise ValueError(
                    f"normalize={params.normalize} and use_activation={params.use_activation} "
                    "disagree; for embeddings they are the same switch, pass one of them.")
            params.normalize = params.use_activation
        if params.normalize is None and params.task in ("embed", "token_embed"):
            st = model_config.st
            params.normalize = st.normalize if st is not None and st.module_types else True
            if getattr(model_config, "colbert", None) is not None:
                params.normalize = True  # ColBERT token vectors are always L2-normalized
        if params.use_activation is None:
            params.use_activation = True
        if params.late_interaction is not None:
            if not isinstance(params.late_interaction, LateInteractionParams):
                raise ValueError("late_interaction must be a LateInteractionParams, got "
                                 f"{type(params.late_interaction).__name__}.")
            # ColBERT scores token vectors; BGE-M3 scores its three outputs of an embed request.
            bge_m3 = params.task == "embed" and bool(params.extra.get("bge_m3"))
            if params.task != "token_embed" and not bge_m3:
                raise ValueError("late_interaction needs task='token_embed' (ColBERT token "
                                 "vectors) or a BGE-M3 embed request, got "
                                 f"task={params.task!r}.")
            params.late_interaction.verify()
        return params
