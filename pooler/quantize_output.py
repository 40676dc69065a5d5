"""Quantized output vectors (issue 16): float32 embeddings -> int8, uint8, binary or ubinary,
with the same numbers as sentence-transformers' `quantize_embeddings`.

- int8 / uint8: each dimension is mapped linearly onto 256 buckets between a per-dimension
  minimum and maximum (`ranges`, shape [2, dim]). Without `ranges` they are taken from
  `calibration_embeddings`, and without those from the embeddings being quantized (so the
  codes depend on the batch: pass `ranges` or calibration embeddings for an index that is
  built in several calls).
- binary / ubinary: one bit per dimension (value > 0), packed 8 to a byte; binary stores each
  byte minus 128 as int8, ubinary as uint8. A vector of 384 floats becomes 48 bytes. Each row
  is packed on its own (sentence-transformers packs the flattened matrix, which only differs
  when the dimension is not a multiple of 8: there its rows share bytes).
"""
from __future__ import annotations

import numpy as np

PRECISIONS = ("float32", "int8", "uint8", "binary", "ubinary")


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is not one of {list(PRECISIONS)}.")
    return precision


def quantization_ranges(embeddings: np.ndarray, ranges=None,
                        calibration_embeddings=None) -> np.ndarray:
    """[2, dim]: row 0 the per-dimension minimum, row 1 the maximum."""
    dim = embeddings.shape[1]
    if ranges is not None:
        ranges = np.asarray(ranges)  # its own dtype, as sentence-transformers computes
        if ranges.shape != (2, dim):
            raise ValueError(f"ranges must have shape [2, {dim}] (per-dimension minimum and "
                             f"maximum), got {list(ranges.shape)}.")
    else:
        source = embeddings if calibration_embeddings is None else np.asarray(
            calibration_embeddings)
        if source.ndim != 2 or source.shape[1] != dim:
            raise ValueError(f"calibration_embeddings must have shape [n, {dim}], got "
                             f"{list(source.shape)}.")
        ranges = np.vstack((source.min(axis=0), source.max(axis=0)))  # [2, dim]
    if np.any(ranges[1] <= ranges[0]):
        raise ValueError("int8/uint8 need a maximum above the minimum in every dimension: pass "
                         "`ranges` ([2, dim]) or calibration embeddings (several vectors; `pooler embed "
                         "--calibration FILE.npy`); "
                         "from a single vector the range of each dimension is empty.")
    return ranges


def quantize_embeddings(embeddings, precision: str, ranges=None,
                        calibration_embeddings=None, clip: bool = False) -> np.ndarray:
    """embeddings [n, dim] float -> [n, dim] (float32, int8, uint8) or [n, ceil(dim/8)]
    (binary as int8, ubinary as uint8). Values outside `ranges` always go to the end buckets
    (sentence-transformers 6 does the same); `clip` is kept for callers and changes nothing."""
    check_precision(precision)
    embeddings = np.asarray(embeddings)
    if embeddings.dtype in (np.int8, np.uint8):
        raise ValueError("Only float embeddings can be quantized, got "
                         f"{embeddings.dtype}.")
    embeddings = embeddings.astype(np.float32, copy=False)
    if embeddings.ndim != 2:
        raise ValueError(f"embeddings must be a [n, dim] matrix, got shape "
                         f"{list(embeddings.shape)}.")
    if precision == "float32":
        return embeddings
    if precision in ("int8", "uint8"):
        bounds = quantization_ranges(embeddings, ranges, calibration_embeddings)
        starts = bounds[0]  # [dim]
        steps = (bounds[1] - bounds[0]) / 255  # [dim]
        # [n, dim], 0..255 inside the range; values outside go to the end buckets, as
        # sentence-transformers >= 6 does (5.x let them wrap around)
        buckets = np.clip(np.floor((embeddings - starts) / steps), 0, 255)
        if precision == "uint8":
            return buckets.astype(np.uint8)
        return (buckets - 128).astype(np.int8)
    bits = np.packbits(embeddings > 0, axis=-1)  # [n, ceil(dim / 8)] uint8
    if precision == "ubinary":
        return bits
    return (bits.astype(np.int16) - 128).astype(np.int8)
