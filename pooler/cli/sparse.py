"""`pooler sparse`: texts in, SPLADE sparse embeddings out as JSONL.

One line per input: {index, text, num_tokens, weights: {token_id: weight}} plus, with --tokens,
{token: weight}; weights are listed largest first.
"""
from __future__ import annotations

import json
import sys

from pooler.cli.common import (add_engine_args, add_input_args, add_truncation_arg,
                               engine_from_args, read_texts)


def add_parser(sub) -> None:
    p = sub.add_parser("sparse", help="SPLADE sparse embeddings of texts",
                       description="Sparse (SPLADE) embeddings from a *ForMaskedLM model; one "
                       "JSON line per input.")
    add_engine_args(p)
    add_input_args(p)
    p.add_argument("--output", "-o", default="-", help="'-' for stdout, or a .jsonl path")
    p.add_argument("--top-k", type=int, default=None, help="keep the k largest weights")
    p.add_argument("--threshold", type=float, default=None,
                   help="keep only weights above this value")
    p.add_argument("--pooling", choices=["max", "sum"], default=None,
                   help="pool token weights by max (default) or sum")
    p.add_argument("--skip-special-tokens", action="store_true",
                   help="leave [CLS]/[SEP] out of the pooling")
    p.add_argument("--query", action="store_true",
                   help="encode as queries (inference-free models use static weights)")
    p.add_argument("--tokens", action="store_true", help="also write {token: weight}")
    add_truncation_arg(p)
    p.set_defaults(func=run)


def run(args) -> int:
    texts = read_texts(args)
    engine = engine_from_args(args)
    outputs = engine.embed_sparse(texts, top_k=args.top_k, threshold=args.threshold,
                                  pooling=args.pooling,
                                  skip_special_tokens=args.skip_special_tokens,
                                  query=args.query, truncate=not args.no_truncate)
    out = sys.stdout if args.output == "-" else open(args.output, "w", encoding="utf-8")
    try:
        for i, (text, o) in enumerate(zip(texts, outputs)):
            record = {"index": i, "text": text, "num_tokens": o.num_tokens,
                      "weights": {str(k): round(v, 6) for k, v in o.to_dict().items()}}
            if args.tokens:
                record["tokens"] = {t: round(v, 6) for t, v in o.to_token_dict().items()}
            out.write(json.dumps(record) + "\n")
    finally:
        if out is not sys.stdout:
            out.close()
    return 0
