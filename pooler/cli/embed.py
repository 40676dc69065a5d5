"""`pooler embed`: texts in, embeddings out as JSONL (stdout or file) or .npy."""
from __future__ import annotations

import json
import sys

import numpy as np

from pooler.cli.common import (add_engine_args, add_input_args, add_truncation_arg,
                               engine_from_args, read_texts)


def add_parser(sub) -> None:
    p = sub.add_parser("embed", help="embed texts", description="Embed texts; one JSON line "
                       "per input ({index, text, embedding}) or a .npy matrix.")
    add_engine_args(p)
    add_input_args(p)
    p.add_argument("--output", "-o", default="-",
                   help="'-' for JSONL on stdout, a .jsonl path, or a .npy path")
    p.add_argument("--dimensions", type=int, default=None, help="Matryoshka truncation")
    p.add_argument("--no-normalize", action="store_true", help="skip L2 normalization")
    add_truncation_arg(p)
    p.add_argument("--prompt-name", default=None, help="a prompt the model declares")
    p.add_argument("--prompt", default=None, help="a literal prefix for every text")
    p.add_argument("--preview", action="store_true",
                   help="print a readable summary (first values, norm, cosine similarities) "
                        "instead of JSONL")
    p.set_defaults(func=run)


def run(args) -> int:
    texts = read_texts(args)
    engine = engine_from_args(args)
    outputs = engine.embed(texts, dimensions=args.dimensions,
                           normalize=False if args.no_normalize else None,
                           truncate=not args.no_truncate, prompt=args.prompt,
                           prompt_name=args.prompt_name)
    if args.preview:
        _print_preview(texts, outputs)
        return 0
    if args.output.endswith(".npy"):
        np.save(args.output, np.stack([o.embedding for o in outputs]))
        print(f"wrote {len(outputs)} x {outputs[0].embedding.shape[0]} to {args.output}",
              file=sys.stderr)
        return 0
    out = sys.stdout if args.output == "-" else open(args.output, "w", encoding="utf-8")
    try:
        for i, (text, o) in enumerate(zip(texts, outputs)):
            out.write(json.dumps({"index": i, "text": text,
                                  "embedding": [round(float(x), 7) for x in o.embedding]}) + "\n")
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
