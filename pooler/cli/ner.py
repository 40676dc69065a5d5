"""`pooler ner`: texts in, entities with character offsets out (JSONL, or a table)."""
from __future__ import annotations

import json
import sys

from pooler.cli.common import (add_engine_args, add_input_args, engine_from_args, read_texts,
                               split_labels)
from pooler.ner import AGGREGATION_STRATEGIES


def add_parser(sub) -> None:
    p = sub.add_parser("ner", help="find entities (names, emails, ...) in texts",
                       description="Named-entity recognition with a token-classification "
                       "model, or zero-shot with a GLiNER model (--labels); one JSON line per "
                       "input ({index, text, entities}).")
    add_engine_args(p)
    add_input_args(p)
    p.add_argument("--aggregation-strategy", default="simple", choices=AGGREGATION_STRATEGIES,
                   help="how tokens merge into entities (as the transformers pipeline)")
    p.add_argument("--ignore-label", action="append", default=None,
                   help="label to drop (repeatable; default: O)")
    p.add_argument("--ignore-subwords", action="store_true",
                   help="sub-word continuation tokens carry no label of their own")
    p.add_argument("--labels", action="append", default=None, metavar="LABELS",
                   help="GLiNER (zero-shot) models: entity types to find, comma-separated "
                   "(repeatable), e.g. --labels person,company")
    p.add_argument("--threshold", type=float, default=None,
                   help="GLiNER models: keep spans scoring above this (default 0.5)")
    p.add_argument("--nested", action="store_true",
                   help="GLiNER models: allow an entity inside another (flat_ner=False)")
    p.add_argument("--multi-label", action="store_true",
                   help="GLiNER models: one span may carry several labels")
    p.add_argument("--table", action="store_true", help="print a readable table instead")
    p.set_defaults(func=run)


def run(args) -> int:
    texts = read_texts(args)
    engine = engine_from_args(args)
    zero_shot = {name: value for name, value in (
        ("labels", split_labels(args.labels)), ("threshold", args.threshold),
        ("flat_ner", False if args.nested else None),
        ("multi_label", True if args.multi_label else None)) if value is not None}
    results = engine.ner(texts, aggregation_strategy=args.aggregation_strategy,
                         ignore_labels=tuple(args.ignore_label or ("O",)),
                         ignore_subwords=args.ignore_subwords, **zero_shot)
    for i, (text, entities) in enumerate(zip(texts, results)):
        if args.table:
            print(f"[{i}] {text}")
            for e in entities:
                print(f"    {e.label:<20} {e.score:.3f}  {e.start}:{e.end}  "
                      f"{text[e.start:e.end]!r}")
            continue
        records = [{**e.to_dict(), "score": round(e.score, 6), "text": text[e.start:e.end]}
                   for e in entities]
        sys.stdout.write(json.dumps({"index": i, "text": text, "entities": records}) + "\n")
    return 0
