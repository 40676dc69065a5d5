"""`pooler classify`: texts (or text pairs) in, label scores out as JSONL."""
from __future__ import annotations

import json
import sys

from pooler.cli.common import (add_engine_args, add_input_args, add_truncation_arg,
                               engine_from_args, read_texts)


def add_parser(sub) -> None:
    p = sub.add_parser("classify", help="classify texts or sentence pairs",
                       description="Classify texts; one JSON line per input "
                       "({index, text, label, score, labels}).")
    add_engine_args(p)
    add_input_args(p)
    p.add_argument("--pair", action="append", default=None,
                   help="second text of a pair, once per input text (cross-encoders)")
    p.add_argument("--raw-logits", action="store_true", help="skip the activation")
    add_truncation_arg(p)
    p.set_defaults(func=run)


def run(args) -> int:
    texts = read_texts(args)
    engine = engine_from_args(args)
    outputs = engine.classify(texts, text_pair=args.pair,
                              use_activation=False if args.raw_logits else None,
                              truncate=not args.no_truncate)
    for i, (text, o) in enumerate(zip(texts, outputs)):
        record = {"index": i, "text": text}
        if args.pair:
            record["text_pair"] = args.pair[i]
        record.update(label=o.label, score=round(o.score, 6),
                      labels=[{"label": x["label"], "score": round(x["score"], 6)}
                              for x in o.labels])
        sys.stdout.write(json.dumps(record) + "\n")
    return 0
