"""`pooler embed`: texts (and, for image-text models, --image files) in, embeddings out as
JSONL (stdout or file), .npy or .csv; float32 or quantized (--precision int8/uint8/binary/
ubinary)."""
from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import numpy as np

from pooler.cli.common import (add_engine_args, add_input_args, add_truncation_arg,
                               engine_from_args, read_texts)
from pooler.quantize_output import PRECISIONS


def add_parser(sub) -> None:
    p = sub.add_parser("embed", help="embed texts", description="Embed texts; one JSON line "
                       "per input ({index, text, embedding}) or a .npy matrix.")
    add_engine_args(p)
    add_input_args(p)
    p.add_argument("--image", action="append", default=None, metavar="PATH",
                   help="an image file to embed (repeatable), for image-text models (CLIP, "
                        "SigLIP): its vector shares the texts' space; JSONL lines carry "
                        "'image' instead of 'text'")
    p.add_argument("--output", "-o", default="-",
                   help="'-' for JSONL on stdout, or a .jsonl, .npy or .csv path (.csv: "
                        "index, text, then one column per dimension)")
    p.add_argument("--dimensions", type=int, default=None, help="Matryoshka truncation")
    p.add_argument("--no-normalize", action="store_true", help="skip L2 normalization")
    add_truncation_arg(p)
    p.add_argument("--prompt-name", default=None, help="a prompt the model declares")
    p.add_argument("--prompt", default=None, help="a literal prefix for every text")
    p.add_argument("--precision", default="float32", choices=PRECISIONS,
                   help="quantized vectors as sentence-transformers' quantize_embeddings: "
                        "int8/uint8 (256 buckets per dimension), binary/ubinary (1 bit per "
                        "dimension, packed in bytes) (default: %(default)s)")
    p.add_argument("--calibration", default=None, metavar="FILE.npy",
                   help="int8/uint8: a .npy of calibration embeddings [n, dim] (or ranges "
                        "[2, dim]) to take each dimension's range from; without it the range "
                        "comes from the texts being embedded")
    p.add_argument("--long-input", default="truncate", choices=["truncate", "chunk"],
                   help="texts longer than the model: truncate, or embed them window by "
                        "window and average (default: %(default)s)")
    p.add_argument("--chunk-overlap", type=int, default=0,
                   help="with --long-input chunk: tokens consecutive windows share")
    p.add_argument("--preview", action="store_true",
                   help="print a readable summary (first values, norm, cosine similarities) "
                        "instead of JSONL")
    p.set_defaults(func=run)


_FORMATS = (".jsonl", ".npy", ".csv")


def _quantization_kwargs(args) -> dict:
    if args.calibration is None:
        return {"precision": args.precision}
    if args.precision not in ("int8", "uint8"):
        raise ValueError(f"--calibration is for --precision int8 or uint8, not "
                         f"{args.precision}.")
    calibration = np.load(args.calibration)
    if calibration.ndim == 2 and calibration.shape[0] == 2:
        return {"precision": args.precision, "ranges": calibration}
    return {"precision": args.precision, "calibration_embeddings": calibration}


def run(args) -> int:
    if args.output != "-" and not args.output.endswith(_FORMATS):
        raise ValueError(f"--output {args.output!r}: pooler embed writes '-' (stdout), "
                         f"{', '.join(_FORMATS)} files; pick one of those extensions.")
    image_paths = list(args.image or [])
    texts = read_texts(args) if (args.texts or args.input or not image_paths) else []
    # texts first, then images, in the order given; `labels` name each in the output
    labels = texts + image_paths
    kinds = ["text"] * len(texts) + ["image"] * len(image_paths)
    engine = engine_from_args(args)
    outputs = engine.embed(texts + [Path(p) for p in image_paths], dimensions=args.dimensions,
                           normalize=False if args.no_normalize else None,
                           truncate=not args.no_truncate, prompt=args.prompt,
                           prompt_name=args.prompt_name, long_input=args.long_input,
                           chunk_overlap=args.chunk_overlap, **_quantization_kwargs(args))
    if args.preview:
        _print_preview(labels, outputs)
        return 0
    matrix = np.stack([o.embedding for o in outputs])  # [n, dim] (or [n, dim / 8] bits)
    if args.output.endswith(".npy"):
        np.save(args.output, matrix)
        print(f"wrote {matrix.shape[0]} x {matrix.shape[1]} {matrix.dtype} to {args.output}",
              file=sys.stderr)
        return 0
    values = ([[int(x) for x in row] for row in matrix] if matrix.dtype.kind in "iu"
              else [[round(float(x), 7) for x in row] for row in matrix])
    out = sys.stdout if args.output == "-" else open(args.output, "w", encoding="utf-8",
                                                     newline="")
    try:
        if args.output.endswith(".csv"):
            writer = csv.writer(out)
            writer.writerow(["index", "text"] + [f"e{j}" for j in range(matrix.shape[1])])
            for i, (label, row) in enumerate(zip(labels, values)):
                writer.writerow([i, label, *row])
            return 0
        for i, (label, kind, row) in enumerate(zip(labels, kinds, values)):
            out.write(json.dumps({"index": i, kind: label, "embedding": row}) + "\n")
    finally:
        if out is not sys.stdout:
            out.close()
    return 0


def _print_preview(texts, outputs) -> None:
    matrix = np.stack([o.embedding for o in outputs])  # [num_texts, dim]
    print(f"{len(texts)} embeddings of dimension {matrix.shape[1]}")
    for i, (text, o) in enumerate(zip(texts, outputs)):
        head = " ".join(f"{x:+.4f}" for x in o.embedding[:5])
        print(f"[{i}] {text[:50]!r:52} tokens={o.num_tokens:<4} norm={np.linalg.norm(o.embedding):.4f}"
              f"  [{head} ...]")
    norms = np.linalg.norm(matrix, axis=1, keepdims=True).clip(min=1e-12)
    cosine = (matrix / norms) @ (matrix / norms).T
    print("cosine similarity:")
    for i, row in enumerate(cosine):
        print(f"[{i}] " + " ".join(f"{x:6.3f}" for x in row))
