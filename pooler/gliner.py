"""GLiNER span models (zero-shot NER) as they exist on disk, their word splitter, and decoding.

A GLiNER folder (the `gliner` package's save_pretrained) holds `gliner_config.json` (the head's
settings and, under `encoder_config`, the backbone's HF config), the weights
(`pytorch_model.bin` or `model.safetensors`: backbone under `token_rep_layer.bert_layer.model.`,
then `token_rep_layer.projection`, `rnn.lstm`, `span_rep_layer.span_rep_layer`,
`prompt_rep_layer`) and the tokenizer with the added `<<ENT>>` / `<<SEP>>` tokens beside them.

The model reads one sequence per text: `<<ENT>> label1 <<ENT>> label2 ... <<SEP>> word1 word2
...`, every entry tokenized as its own word (split into words), so each label is scored against
every span of up to `max_width` words (pooler/pooling/gliner.py). This module keeps what needs no
torch: reading the folder, splitting text into words with character offsets, and turning the
span probabilities into entities exactly as gliner 0.2.29's SpanDecoder + greedy search do.
The input builder is pooler/engine/gliner_inputs.py.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from pooler.model_folder import read_json
from pooler.outputs import Entity

CONFIG_FILE = "gliner_config.json"
# Where the backbone's tensors sit in a GLiNER checkpoint.
BACKBONE_PREFIX = "token_rep_layer.bert_layer.model."
# PoolingParams.extra key carrying a request's word and label positions to the GLiNER head.
PARAMS_KEY = "gliner"

SUPPORTED_SPAN_MODES = ("markerV0",)
SUPPORTED_SUBTOKEN_POOLING = ("first", "last")
SUPPORTED_BACKBONES = ("deberta-v2", "deberta")
# model_type values of gliner configs that are the classic uni-encoder span model.
_UNI_ENCODER_SPAN_TYPES = (None, "gliner", "gliner_uni_encoder_span", "gliner_uni_encoder")
_SUPPORTED = ("the uni-encoder span model with span_mode 'markerV0' on a DeBERTa backbone "
              "(urchade/gliner_small-v2.1, gliner_medium-v2.1, gliner_large-v2.1, "
              "gliner_multi-v2.1 and models trained the same way)")

# gliner's "whitespace" splitter: runs of word characters (joined by - or _), or any other
# single non-space character.
_WORD_PATTERN = re.compile(r"\w+(?:[-_]\w+)*|\S")


class LabelsTooLongError(ValueError):
    """A request's label prompt alone fills the model's token limit (the server names
    `labels`)."""


@dataclass(frozen=True)
class GLiNERLayout:
    """What a GLiNER folder declares, checked against what pooler implements."""
    path: Path
    encoder_config: dict[str, Any]  # the backbone's HF config, vocabulary size resolved
    hidden_size: int                # width of the head (a projection maps the backbone to it)
    max_width: int                  # longest span, in words
    max_len: int                    # words of a text the model reads; later words are dropped
    ent_token: str
    sep_token: str
    class_token_index: int          # id of ent_token (-1: look it up in the tokenizer)
    embed_ent_token: bool           # label vector at <<ENT>> (True) or at the label's 1st token
    num_rnn_layers: int             # bi-LSTM layers over the word vectors (0: none)
    subtoken_pooling: str           # which sub-token stands for its word: "first" | "last"


def detect_gliner(folder: Path) -> GLiNERLayout | None:
    """The folder's GLiNER layout, None when it has no gliner_config.json; ValueError naming
    the setting when it is a GLiNER variant pooler does not run."""
    config = read_json(folder / CONFIG_FILE)
    if config is None:
        return None

    def refuse(what: str) -> ValueError:
        return ValueError(f"{folder / CONFIG_FILE}: {what}. pooler serves {_SUPPORTED}.")

    model_type = config.get("model_type")
    if config.get("labels_encoder") or model_type in ("gliner_bi_encoder", "gliner_bi_encoder_span",
                                                      "gliner_bi_encoder_token"):
        raise refuse("bi-encoder GLiNER models (labels_encoder) are not supported")
    if config.get("labels_decoder") or model_type == "gliner_streaming_span" or \
            "decoder" in str(model_type or ""):
        raise refuse("GLiNER models with a label decoder are not supported")
    if config.get("relations_layer") is not None or "relex" in str(model_type or ""):
        raise refuse("GLiNER relation-extraction models are not supported")
    span_mode = config.get("span_mode", "markerV0")
    if span_mode in ("token_level", "token-level") or "token" in str(model_type or ""):
        raise refuse("token-level GLiNER models (span_mode 'token_level') are not supported")
    if model_type not in _UNI_ENCODER_SPAN_TYPES:
        raise refuse(f"model_type {model_type!r} is not supported")
    if span_mode not in SUPPORTED_SPAN_MODES:
        raise refuse(f"span_mode {span_mode!r} is not supported (supported: "
                     f"{list(SUPPORTED_SPAN_MODES)})")
    pooling = config.get("subtoken_pooling", "first")
    if pooling not in SUPPORTED_SUBTOKEN_POOLING:
        raise refuse(f"subtoken_pooling {pooling!r} is not supported (supported: "
                     f"{list(SUPPORTED_SUBTOKEN_POOLING)})")
    for key, what in (("post_fusion_schema", "post-fusion layers"),
                      ("fuse_layers", "fused encoder layers"),
                      ("span_encoder_config", "a span context encoder"),
                      ("precomputed_prompts_mode", "precomputed label embeddings")):
        if config.get(key):
            raise refuse(f"{key}={config[key]!r} ({what}) is not supported")
    splitter = config.get("words_splitter_type", "whitespace")
    if splitter != "whitespace":
        raise refuse(f"words_splitter_type {splitter!r} is not supported (supported: "
                     "'whitespace')")
    encoder = config.get("encoder_config")
    if not isinstance(encoder, dict):
        raise refuse("it has no encoder_config (the backbone's config); save the model with "
                     "gliner >= 0.2 so that the backbone config is stored in gliner_config.json")
    encoder = dict(encoder)
    encoder.setdefault("model_type", "deberta-v2")
    if encoder["model_type"] not in SUPPORTED_BACKBONES:
        raise refuse(f"backbone model_type {encoder['model_type']!r} is not supported "
                     f"(supported: {list(SUPPORTED_BACKBONES)})")
    if not (folder / "tokenizer.json").is_file():
        raise refuse("it has no tokenizer.json beside the weights (older GLiNER repos take the "
                     "backbone's tokenizer from the hub and add <<ENT>>/<<SEP>> when loading); "
                     "load it once with gliner's GLiNER.from_pretrained and save_pretrained it "
                     "to a folder, which writes the tokenizer with the added tokens")
    if int(config.get("vocab_size", -1)) > 0:  # resized for <<ENT>>/<<SEP>>
        encoder["vocab_size"] = int(config["vocab_size"])
    return GLiNERLayout(
        path=folder, encoder_config=encoder, hidden_size=int(config.get("hidden_size", 512)),
        max_width=int(config.get("max_width", 12)), max_len=int(config.get("max_len", 384)),
        ent_token=config.get("ent_token", "<<ENT>>"), sep_token=config.get("sep_token", "<<SEP>>"),
        class_token_index=int(config.get("class_token_index", -1)),
        embed_ent_token=bool(config.get("embed_ent_token", True)),
        num_rnn_layers=int(config.get("num_rnn_layers", 1)), subtoken_pooling=pooling)


# ---- words -------------------------------------------------------------------------------------
def split_words(text: str) -> list[tuple[str, int, int]]:
    """(word, start, end) character spans, as gliner's whitespace splitter yields them."""
    return [(m.group(), m.start(), m.end()) for m in _WORD_PATTERN.finditer(text)]


def misplaced_options(given: Sequence[tuple[str, Any, Any]]) -> list[str]:
    """The names in (name, value, default) whose value is not the default."""
    return [name for name, value, default in given if value != default]


def gliner_options_error(names: Sequence[str], remedy: str, architecture: str | None = None) -> str:
    """GLiNER's options (labels, threshold, flat_ner, multi_label) given to a model that
    predicts its own fixed labels; remedy: "load" (Python) or "serve" (HTTP)."""
    one = len(names) == 1
    which = f" ({architecture})" if architecture else ""
    return (f"{', '.join(names)} {'applies' if one else 'apply'} to GLiNER (zero-shot NER) "
            f"models; this model{which} predicts its own fixed labels. Drop "
            f"{'it' if one else 'them'}, or {remedy} a GLiNER model.")


def token_options_error(names: Sequence[str]) -> str:
    """Token-classification options given to a GLiNER model."""
    return (f"{', '.join(names)} {'applies' if len(names) == 1 else 'apply'} to "
            "token-classification models; a GLiNER model scores word spans (it reads at most "
            "max_len words of each text, as gliner does). Use labels, threshold, flat_ner and "
            "multi_label.")


def labels_required_error(example: str) -> str:
    return ("labels is required with a GLiNER model: name the entity types to find, e.g. "
            f"{example}.")


def normalize_labels(labels: Any, num_texts: int, field: str = "labels") -> list[list[str]]:
    """One label list per text, each de-duplicated in order (as gliner does): `labels` is one
    list shared by every text, or one list per text."""
    if isinstance(labels, str) or not isinstance(labels, (list, tuple)) or not labels:
        raise ValueError(f"{field} must be a non-empty list of entity labels, e.g. "
                         "['person', 'company'] (or one such list per text).")
    per_text = all(isinstance(x, (list, tuple)) for x in labels)
    if per_text:
        if len(labels) != num_texts:
            raise ValueError(f"{field} has {len(labels)} label lists but there are {num_texts} "
                             "texts; give one list per text, or one list for all.")
        sets = [list(x) for x in labels]
    elif any(isinstance(x, (list, tuple)) for x in labels):
        raise ValueError(f"{field} mixes labels and label lists; give one list of strings, or "
                         "one list of strings per text.")
    else:
        sets = [list(labels)] * num_texts
    out = []
    for i, label_set in enumerate(sets):
        where = f"{field}[{i}]" if per_text else field
        if not label_set:
            raise ValueError(f"{where} is empty; give at least one entity label.")
        for label in label_set:
            if not isinstance(label, str) or not label.strip():
                raise ValueError(f"{where} must hold non-empty strings, got {label!r}.")
        out.append(list(dict.fromkeys(label_set)))
    return out


# ---- decoding ----------------------------------------------------------------------------------
def check_threshold(threshold: float, field: str = "threshold") -> float:
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or \
            not 0.0 < float(threshold) <= 1.0:
        raise ValueError(f"{field} must be a number in (0, 1], got {threshold!r}.")
    return float(threshold)


def decode_spans(probs: np.ndarray, num_words: int, labels: Sequence[str], threshold: float,
                 flat_ner: bool = True, multi_label: bool = False
                 ) -> list[tuple[int, int, str, float]]:
    """probs: [num_words, max_width, num_labels] sigmoid scores of span (start, width, label).
    Returns (first word, last word, label, score), as gliner's SpanDecoder + greedy_search:
    candidates above the threshold that end inside the text, taken best score first (ties in
    (start, width, label) order) unless they clash with one already taken, then sorted by start.
    flat_ner: no two entities share a word; else an entity may sit inside another but never
    partly overlap it. multi_label: the same span may carry several labels."""
    starts, widths, classes = np.nonzero(probs > np.float32(threshold))
    keep = starts + widths + 1 <= num_words
    candidates = [(int(s), int(s + w), labels[int(c)], float(probs[s, w, c]))
                  for s, w, c in zip(starts[keep], widths[keep], classes[keep])]
    candidates.sort(key=lambda span: -span[3])  # stable: ties keep (start, width, label) order
    taken: list[tuple[int, int, str, float]] = []
    for span in candidates:
        if not any(_clash(span, other, flat_ner, multi_label) for other in taken):
            taken.append(span)
    taken.sort(key=lambda span: span[0])
    return taken


def _clash(a, b, flat_ner: bool, multi_label: bool) -> bool:
    if a[:2] == b[:2]:
        return not multi_label
    disjoint = a[0] > b[1] or b[0] > a[1]
    if flat_ner:
        return not disjoint
    nested = (a[0] <= b[0] and a[1] >= b[1]) or (b[0] <= a[0] and b[1] >= a[1])
    return not (disjoint or nested)


def spans_to_entities(text: str, words: Sequence[tuple[str, int, int]],
                      spans: Sequence[tuple[int, int, str, float]]) -> list[Entity]:
    """Word spans -> entities with the text they cover and their character offsets."""
    out = []
    for first, last, label, score in spans:
        start, end = words[first][1], words[last][2]
        out.append(Entity(score=score, word=text[start:end], start=start, end=end,
                          entity_group=label))
    return out
