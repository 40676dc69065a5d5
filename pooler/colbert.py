"""ColBERT models as they exist on disk (the input builder is pooler/engine/colbert_inputs.py).

Four layouts, detected from the model folder:
- pylate: sentence-transformers `modules.json` with Transformer + `Dense` (`1_Dense/`, no bias)
  and PyLate's settings in `config_sentence_transformers.json` (`query_prefix`,
  `document_prefix`, `query_length`, `document_length`, `do_query_expansion`,
  `attend_to_expansion_tokens`, `skiplist_words`);
- sentence-transformers: v6's MultiVectorEncoder save: modules.json with Transformer, Dense,
  MultiVectorMask (`skiplist_words`) and Normalize; the markers are the `query` / `document`
  prompts of `config_sentence_transformers.json`, `query_expansion` and `document_length` are in
  `sentence_bert_config.json`;
- stanford: a BERT checkpoint (`HF_ColBERT`) whose weights hold `linear.weight` and an
  `artifact.metadata` with `query_maxlen`, `doc_maxlen`, `query_token_id`, `doc_token_id`,
  `mask_punctuation`, `attend_to_mask_tokens`;
- plain: config.json (or `hf_overrides`) says `"colbert_mode": "plain"` or gives `colbert_dim`:
  no markers, no expansion, no skiplist: last_hidden_state -> linear -> L2 normalize.

Preprocessing, as both reference libraries do it: the text is tokenized with room for one
marker, the marker token goes right after [CLS]; queries are padded with [MASK] up to the query
length (query expansion) and those expansion tokens are attended to or not as configured;
documents are truncated to the document length, and their punctuation (skiplist) tokens are
dropped from the output after encoding.
"""
from __future__ import annotations

import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pooler.model_folder import SentenceTransformerLayout, read_json

from pooler.tokenizer import TextTokenizer

COLBERT_ROLES = ("query", "document")
# PoolingParams.extra keys the ColBERT pooler and the model runner read.
ROLE_KEY = "colbert_role"
UNATTENDED_KEY = "num_unattended_suffix"

# Checkpoint names of the Stanford / plain projection.
LINEAR_WEIGHT_NAMES = ("linear.weight", "colbert_linear.weight")

# PyLate's defaults when config_sentence_transformers.json leaves a setting out.
_PYLATE_DEFAULTS = {"query_prefix": "[Q] ", "document_prefix": "[D] ", "query_length": 32,
                    "document_length": 180, "do_query_expansion": True,
                    "attend_to_expansion_tokens": False}
# Stanford ColBERT's defaults (its ColBERTConfig) when artifact.metadata lacks a key.
_STANFORD_DEFAULTS = {"query_token_id": "[unused0]", "doc_token_id": "[unused1]",
                      "query_maxlen": 32, "doc_maxlen": 180, "mask_punctuation": True,
                      "attend_to_mask_tokens": False}


@dataclass
class ColBERTConfig:
    layout: str                   # "pylate" | "sentence-transformers" | "stanford" | "plain"
    query_marker: str | None = None        # token put after [CLS] of a query (None: none)
    document_marker: str | None = None
    query_length: int | None = None        # queries are truncated (and expanded) to this
    document_length: int | None = None     # documents are truncated to this
    do_query_expansion: bool = False
    attend_to_expansion_tokens: bool = False
    skiplist_words: list[str] = field(default_factory=list)
    # Stanford resolves punctuation by encoding each symbol; PyLate by vocabulary lookup.
    skiplist_by_encoding: bool = False
    dense_path: Path | None = None         # pylate: the 1_Dense folder (read by the projector)

    @property
    def needs_key_mask(self) -> bool:
        """Queries carry expansion tokens that no token may attend to."""
        return self.do_query_expansion and not self.attend_to_expansion_tokens


def detect_colbert(path: Path, hf_config: dict[str, Any],
                   st: SentenceTransformerLayout | None) -> ColBERTConfig | None:
    """Return the folder's ColBERT settings, or None for a model that is not ColBERT."""
    mode = hf_config.get("colbert_mode")
    if mode is not None and mode != "plain":
        raise ValueError(f"colbert_mode must be 'plain' (or absent), got {mode!r}.")
    if mode == "plain":
        return ColBERTConfig(layout="plain")
    if st is not None and (st.extra.get("model_type") == "MultiVectorEncoder"
                           or "MultiVectorMask" in st.module_types):
        return _multi_vector_encoder_config(path, st)
    if _is_pylate(st):
        return _pylate_config(st)
    architectures = hf_config.get("architectures") or []
    if "HF_ColBERT" in architectures or (path / "artifact.metadata").is_file():
        return _stanford_config(read_json(path / "artifact.metadata") or {})
    if "colbert_dim" in hf_config:
        return ColBERTConfig(layout="plain")
    return None

def _is_pylate(st: SentenceTransformerLayout | None) -> bool:
    if st is None or st.pooling is not None or "Dense" not in st.module_types:
        return False
    extra = st.extra
    return ("query_prefix" in extra or extra.get("similarity_fn_name") == "MaxSim"
            or extra.get("model_type") == "ColBERT")


def _pylate_config(st: SentenceTransformerLayout) -> ColBERTConfig:
    settings = {**_PYLATE_DEFAULTS, **{k: v for k, v in st.extra.items()
                                       if k in _PYLATE_DEFAULTS and v is not None}}
    for dense in st.dense:
        dense_config = read_json(dense.path / "config.json") or {}
        if dense_config.get("use_residual"):
            raise ValueError(f"{dense.path}: PyLate Dense with use_residual=true is not "
                             "supported.")
    expansion = bool(settings["do_query_expansion"])
    skiplist = st.extra.get("skiplist_words")
    return ColBERTConfig(
        layout="pylate",
        query_marker=settings["query_prefix"] or None,
        document_marker=settings["document_prefix"] or None,
        query_length=_positive_int(settings["query_length"], "query_length"),
        document_length=_positive_int(settings["document_length"], "document_length"),
        do_query_expansion=expansion,
        attend_to_expansion_tokens=expansion and bool(settings["attend_to_expansion_tokens"]),
        skiplist_words=list(string.punctuation if skiplist is None else skiplist))


def _multi_vector_encoder_config(path: Path, st: SentenceTransformerLayout) -> ColBERTConfig:
    """sentence-transformers 6's own save: the markers are its `query` / `document` prompts,
    query expansion and the document length sit in sentence_bert_config.json, the skiplist in
    the MultiVectorMask module. Settings outside what PyLate and Stanford do are refused."""
    def refuse(what: str) -> ValueError:
        return ValueError(f"{path}: this sentence-transformers MultiVectorEncoder save has "
                          f"{what}, which pooler does not implement; it serves the PyLate-style "
                          "settings (fixed query expansion with the mask token, a document "
                          "skiplist, MaxSim over normalized vectors).")

    modules = read_json(path / "modules.json") or []
    by_type = {m["type"].rsplit(".", 1)[-1]: path / m.get("path", "") for m in modules}
    unknown = set(by_type) - {"Transformer", "Dense", "MultiVectorMask", "Normalize"}
    if unknown or "Normalize" not in by_type:
        raise refuse(f"modules {sorted(unknown) or 'without Normalize'}")
    similarity = str(st.extra.get("similarity_fn_name") or "maxsim").lower()
    if similarity != "maxsim":
        raise refuse(f"similarity_fn_name={similarity!r}")
    transformer = read_json(by_type["Transformer"] / "sentence_bert_config.json") or {}
    expansion = transformer.get("query_expansion") or {"strategy": "none"}
    strategy = expansion.get("strategy", "none")
    if strategy not in ("fixed", "none") or expansion.get("token") is not None:
        raise refuse(f"query_expansion={expansion!r}")
    mask = read_json(by_type.get("MultiVectorMask", path / "-") / "config.json") or {}
    if mask.get("keep_only_token_ids") or set(mask.get("skiplist_tasks") or ["document"]) != \
            {"document"}:
        raise refuse(f"MultiVectorMask {mask!r}")
    length = transformer.get("max_seq_length") or 512
    prompts = st.prompts
    return ColBERTConfig(
        layout="sentence-transformers",
        query_marker=prompts.get("query") or None,
        document_marker=prompts.get("document") or None,
        query_length=_positive_int(expansion.get("length", length), "query_expansion.length"),
        document_length=_positive_int(transformer.get("document_length", length),
                                      "document_length"),
        do_query_expansion=strategy == "fixed",
        attend_to_expansion_tokens=strategy == "fixed" and bool(expansion.get("attend")),
        skiplist_words=list(mask.get("skiplist_words") or []))


def _stanford_config(metadata: dict[str, Any]) -> ColBERTConfig:
    settings = {**_STANFORD_DEFAULTS, **{k: v for k, v in metadata.items()
                                         if k in _STANFORD_DEFAULTS and v is not None}}
    return ColBERTConfig(
        layout="stanford",
        query_marker=settings["query_token_id"], document_marker=settings["doc_token_id"],
        query_length=_positive_int(settings["query_maxlen"], "query_maxlen"),
        document_length=_positive_int(settings["doc_maxlen"], "doc_maxlen"),
        do_query_expansion=True,  # Stanford ColBERT always pads queries with [MASK]
        attend_to_expansion_tokens=bool(settings["attend_to_mask_tokens"]),
        skiplist_words=list(string.punctuation) if settings["mask_punctuation"] else [],
        skiplist_by_encoding=True)


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 3:
        raise ValueError(f"ColBERT setting {name} must be an integer >= 3, got {value!r}.")
    return value


# ---- token ids ------------------------------------------------------------------------------
@dataclass
class ColBERTTokens:
    """The ids a ColBERT config needs, resolved against the model's tokenizer."""
    query_marker_id: int | None
    document_marker_id: int | None
    expansion_id: int | None       # [MASK] (or the tokenizer's pad/eos fallback)
    skiplist_ids: frozenset[int]

    @classmethod
    def resolve(cls, config: ColBERTConfig, tokenizer: "TextTokenizer") -> "ColBERTTokens":
        def marker(token: str | None, what: str) -> int | None:
            if token is None:
                return None
            token_id = tokenizer.token_to_id(token)
            if token_id is None:
                raise ValueError(f"ColBERT {what} marker {token!r} is not in the tokenizer's "
                                 "vocabulary.")
            return token_id

        unk = tokenizer.special_token_id("unk_token")
        skip: set[int] = set()
        for word in config.skiplist_words:
            if config.skiplist_by_encoding:
                ids = tokenizer.encode_batch([word], add_special_tokens=False)[0].input_ids
                token_id = ids[0] if ids else None
            else:  # PyLate: convert_tokens_to_ids, which maps unknown words to [UNK]
                token_id = tokenizer.token_to_id(word)
                token_id = unk if token_id is None else token_id
            if token_id is not None:
                skip.add(token_id)
        expansion = None
        if config.do_query_expansion:
            for name in ("mask_token", "eos_token", "pad_token"):
                expansion = tokenizer.special_token_id(name)
                if expansion is not None:
                    break
            if expansion is None:
                raise ValueError("Query expansion needs a [MASK], EOS or pad token; the "
                                 "tokenizer has none.")
        return cls(marker(config.query_marker, "query"),
                   marker(config.document_marker, "document"), expansion, frozenset(skip))
