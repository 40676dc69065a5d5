"""Pooling task names and the task sets the runners reason about."""
from typing import Literal, get_args

PoolingTask = Literal["embed", "classify", "token_embed", "token_classify"]

POOLING_TASKS: tuple[str, ...] = get_args(PoolingTask)
TOKEN_TASKS: frozenset[str] = frozenset({"token_embed", "token_classify"})

# Order used to pick a model's default task when none is given explicitly.
TASK_PREFERENCE: tuple[str, ...] = ("embed", "classify", "token_embed", "token_classify")


def check_task(task: str) -> str:
    if task not in POOLING_TASKS:
        raise ValueError(
            f"Unknown task: {task!r}. Valid tasks: {sorted(POOLING_TASKS)}.")
    return task


# What a user calls each task, and the kind of model folder that has it.
_TASK_NEEDS = {
    "embed": ("embeddings", "a sentence-embedding model (a sentence-transformers folder, or an "
                            "encoder such as *Model)"),
    "classify": ("classification and cross-encoder reranking", "a sequence-classification "
                 "model (a *ForSequenceClassification folder: a classifier or a cross-encoder)"),
    "token_embed": ("per-token embeddings (ColBERT)", "an encoder or a ColBERT model"),
    "token_classify": ("named-entity recognition (NER) and token classification",
                       "a token-classification model (a *ForTokenClassification folder, e.g. "
                       "a NER or PII model)"),
}
_COMMANDS = {"embed": "pooler embed", "classify": "pooler classify",
             "token_embed": "pooler embed", "token_classify": "pooler ner"}
_MODEL_KINDS = {"embed": "a sentence embedder", "classify": "a sequence classifier",
                "token_embed": "a per-token (ColBERT) encoder",
                "token_classify": "a token classifier"}


def unsupported_task_message(task: str, supported, model_task: str, architecture: str) -> str:
    """'Unsupported task: ...' (vLLM's wording first), then in user words which kind of model
    the task needs and how to load one."""
    what, needs = _TASK_NEEDS.get(task, (repr(task), "a model that has this task"))
    kind = _MODEL_KINDS.get(model_task, "a model without it")
    command = _COMMANDS.get(task, "pooler embed")
    return (f"Unsupported task: {task!r}. Supported tasks: {sorted(supported)}. {what[0].upper()}"
            f"{what[1:]} need {needs}; this model ({architecture}) is {kind}. Load such a "
            f"model: Engine('path/or/hub-name') in Python, `{command} --model PATH` on the "
            "command line, or serve it with `pooler serve PATH`.")
