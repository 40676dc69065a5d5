"""Rerankers that are language models: the relevance is a yes/no token's logit under a prompt.

Qwen3-Reranker is a `Qwen3ForCausalLM`; its model card scores a (query, document) pair by
writing both into a chat prompt and taking softmax([logit("no"), logit("yes")])[yes] at the
last position. pooler serves it as vLLM converts it: a sequence classifier whose one label's
weight is lm_head["yes"] - lm_head["no"], so sigmoid of that logit is the same probability
(sigmoid(a - b) = softmax([b, a])[1]) without computing the vocabulary's logits.

Selected by the overrides vLLM documents (`hf_overrides={"architectures":
["Qwen3ForSequenceClassification"], "classifier_from_token": ["no", "yes"],
"is_original_qwen3_reranker": True}`), or detected for a `Qwen3ForCausalLM` whose name says
Qwen3-Reranker (the hub repository or the folder).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

QWEN3_RERANKER_OVERRIDES = {
    "architectures": ["Qwen3ForSequenceClassification"],
    "classifier_from_token": ["no", "yes"],
    "is_original_qwen3_reranker": True,
}

# The model card's prompt (Qwen/Qwen3-Reranker-0.6B README).
_QWEN3_PREFIX = ('<|im_start|>system\nJudge whether the Document meets the requirements based on '
                 'the Query and the Instruct provided. Note that the answer can only be "yes" '
                 'or "no".<|im_end|>\n<|im_start|>user\n')
_QWEN3_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"

_QWEN3_RERANKER_NAME = re.compile(r"qwen3[-_]?reranker", re.IGNORECASE)


@dataclass(frozen=True)
class RerankPrompt:
    """How a (query, document) pair becomes one sequence: prefix + body + suffix, each
    tokenized on its own (as the model card does), the body cut first when too long."""
    prefix: str
    suffix: str
    instruction: str

    def body(self, query: str, document: str) -> str:
        return f"<Instruct>: {self.instruction}\n<Query>: {query}\n<Document>: {document}"


def apply_reranker_overrides(hf_config: dict, model_name: str, user_overrides: dict) -> dict:
    """The overrides that turn a Qwen3-Reranker folder into its classifier form, when the
    folder is one and the user did not choose otherwise; else {}."""
    if user_overrides.get("architectures") or hf_config.get("architectures") != ["Qwen3ForCausalLM"]:
        return {}
    if not _QWEN3_RERANKER_NAME.search(model_name):
        return {}
    return dict(QWEN3_RERANKER_OVERRIDES)


def rerank_prompt_of(hf_config: dict) -> RerankPrompt | None:
    """The prompt of an original Qwen3-Reranker (after overrides); None for other models.
    `hf_overrides={"instruction": "..."}` replaces the default task instruction."""
    if not hf_config.get("is_original_qwen3_reranker"):
        return None
    return RerankPrompt(_QWEN3_PREFIX, _QWEN3_SUFFIX,
                        hf_config.get("instruction") or DEFAULT_INSTRUCTION)


def check_classifier_from_token(hf_config: dict) -> list[str] | None:
    """The tokens whose lm_head rows make the classifier; validated."""
    tokens = hf_config.get("classifier_from_token")
    if tokens is None:
        return None
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise ValueError("hf_overrides classifier_from_token must be a list of token strings, "
                         f"e.g. ['no', 'yes']; got {tokens!r}.")
    if hf_config.get("is_original_qwen3_reranker") and len(tokens) != 2:
        raise ValueError("is_original_qwen3_reranker takes exactly two classifier_from_token "
                         f"tokens (the 'no' token, then the 'yes' token); got {tokens!r}.")
    return tokens


def classifier_from_token_labels(hf_config: dict, runner: str) -> dict:
    """Label overrides of a classifier made from token rows: one label named after the 'yes'
    token for the original Qwen3-Reranker (sigmoid), else one label per token (softmax)."""
    tokens = check_classifier_from_token(hf_config)
    if tokens is None:
        return {}
    if runner != "native":
        raise ValueError("classifier_from_token (Qwen3-Reranker) is implemented by the native "
                         "runner; drop runner='transformers'.")
    labels = tokens[1:] if hf_config.get("is_original_qwen3_reranker") else tokens
    return {"id2label": {str(i): t for i, t in enumerate(labels)},
            "num_labels": len(labels), "problem_type": None}
