"""One task's outputs for a list of texts as Arrow columns (shared by `pooler batch` and the Ray
Data path, so both write the same Parquet schema).

- embed: `embedding` fixed_size_list<float32|float16|int8|uint8>[dim]
- sparse: `indices` list<int32>, `values` list<float32> (weight descending)
- token_embed: `embeddings` list<fixed_size_list<float32|...>[dim]> (one vector per token;
  for a page image, one per image and prompt token, about 1/pool_factor of them when pooled)
- classify: `label` string, `score` float32, `probs` fixed_size_list<float32>[num_labels]
- ner: `entities` list<struct<entity_group, score, word, start, end>>
and `num_tokens` int32 for every task but ner.

Precisions (dense vectors): float32; float16; int8 = round(clip(x, -1, 1) * 127), meant for
normalized vectors; binary = one bit per dimension (x > 0) packed 8 per uint8, big-endian as
numpy.packbits (sentence-transformers' "ubinary").
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa

TASKS = ("embed", "sparse", "token_embed", "classify", "ner")
PRECISIONS = ("float32", "float16", "int8", "binary")


@dataclass
class TaskOptions:
    task: str = "embed"
    precision: str = "float32"
    dimensions: int | None = None          # embed: Matryoshka truncation
    normalize: bool | None = None          # embed / token_embed: default follows the model
    truncate: bool = True
    prompt_name: str | None = None
    prompt: str | None = None
    top_k: int | None = None               # sparse
    pool_factor: float | None = None       # token_embed (ColBERT, page models): keep ~1/factor
    aggregation_strategy: str = "simple"   # ner
    labels: list[str] | None = None        # ner with a GLiNER model: entity types to find
    threshold: float | None = None         # ner, GLiNER
    flat_ner: bool | None = None           # ner, GLiNER

    def __post_init__(self):
        if self.task not in TASKS:
            raise ValueError(f"--task must be one of {', '.join(TASKS)}; got {self.task!r}.")
        if self.precision not in PRECISIONS:
            raise ValueError(f"--precision must be one of {', '.join(PRECISIONS)}; "
                             f"got {self.precision!r}.")
        given = [name for name in ("labels", "threshold", "flat_ner")
                 if getattr(self, name) is not None]
        if given and self.task != "ner":
            raise ValueError(f"--{given[0].replace('_', '-')} applies to --task ner with a GLiNER "
                             f"model, not to task {self.task!r}.")
        if self.pool_factor is not None and self.task != "token_embed":
            raise ValueError(f"--pool-factor pools multi-vectors: it applies to --task "
                             f"token_embed, not to task {self.task!r}.")
        if self.precision != "float32" and self.task not in ("embed", "token_embed"):
            raise ValueError(f"--precision applies to dense vectors (embed, token_embed), "
                             f"not to task {self.task!r}.")

    def to_dict(self) -> dict:
        return asdict(self)


def compute_columns(engine, texts: list, opts: TaskOptions) -> dict[str, pa.Array]:
    """Run `texts` (valid, non-empty strings; or decoded images for embed and token_embed,
    pooler/batch/images.py) through the engine; the task's columns."""
    kw = dict(truncate=opts.truncate, use_tqdm=False)
    if opts.task == "embed":
        out = engine.embed(texts, dimensions=opts.dimensions, normalize=opts.normalize,
                           prompt=opts.prompt, prompt_name=opts.prompt_name, **kw)
        dim = out[0].embedding.shape[0] if out else 0
        matrix = np.stack([o.embedding for o in out]) if out else np.zeros((0, dim))  # [n, dim]
        cols = {"embedding": _fixed_lists(quantize(matrix, opts.precision))}
    elif opts.task == "token_embed":
        out = engine.token_embed(texts, normalize=opts.normalize, prompt=opts.prompt,
                                 prompt_name=opts.prompt_name, pool_factor=opts.pool_factor,
                                 **kw)
        cols = {"embeddings": _nested_lists(
            [quantize(o.embeddings, opts.precision) for o in out])}  # each [num_tokens, dim]
    elif opts.task == "sparse":
        out = engine.embed_sparse(texts, top_k=opts.top_k, prompt=opts.prompt,
                                  prompt_name=opts.prompt_name, **kw)
        cols = {"indices": pa.array([o.indices.astype(np.int32) for o in out],
                                    type=pa.list_(pa.int32())),
                "values": pa.array([o.values for o in out], type=pa.list_(pa.float32()))}
    elif opts.task == "classify":
        out = engine.classify(texts, **kw)
        probs = np.stack([o.probs for o in out]).astype(np.float32)  # [n, num_labels]
        cols = {"label": pa.array([o.label for o in out], type=pa.string()),
                "score": pa.array([o.score for o in out], type=pa.float32()),
                "probs": _fixed_lists(probs)}
    else:  # ner
        zero_shot = {name: getattr(opts, name) for name in ("labels", "threshold", "flat_ner")
                     if getattr(opts, name) is not None}
        entities = engine.ner(texts, aggregation_strategy=opts.aggregation_strategy, **kw,
                              **zero_shot)
        cols = {"entities": pa.array(
            [[{"entity_group": e.label, "score": e.score, "word": e.word, "start": e.start,
               "end": e.end} for e in row] for row in entities], type=pa.list_(ENTITY))}
        return cols  # Engine.ner reports entities, not token counts
    return {**cols, "num_tokens": pa.array([o.num_tokens for o in out], type=pa.int32())}


ENTITY = pa.struct([("entity_group", pa.string()), ("score", pa.float32()),
                    ("word", pa.string()), ("start", pa.int32()), ("end", pa.int32())])


def quantize(vectors: np.ndarray, precision: str) -> np.ndarray:
    """[..., dim] float32 -> [..., dim] float32/float16/int8, or [..., ceil(dim / 8)] uint8."""
    if precision == "float16":
        return vectors.astype(np.float16)
    if precision == "int8":
        return np.rint(np.clip(vectors, -1.0, 1.0) * 127).astype(np.int8)
    if precision == "binary":
        return np.packbits(vectors > 0, axis=-1)
    return vectors.astype(np.float32, copy=False)


def _fixed_lists(matrix: np.ndarray) -> pa.FixedSizeListArray:
    """[n, d] -> n fixed-size lists of d values."""
    return pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(matrix).reshape(-1)),
                                             matrix.shape[1])


def _nested_lists(arrays: list[np.ndarray]) -> pa.ListArray:
    """n arrays of [t_i, d] -> n lists of t_i fixed-size lists of d values."""
    dim = arrays[0].shape[1] if arrays else 0
    flat = np.concatenate(arrays) if arrays else np.zeros((0, dim), np.float32)  # [sum t_i, d]
    offsets = np.concatenate([[0], np.cumsum([len(a) for a in arrays])]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), _fixed_lists(flat))
