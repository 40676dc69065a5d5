"""`pooler score` and `pooler rerank`: relevance of documents to queries, as JSONL.

Works with ColBERT (MaxSim), cross-encoder (classifier relevance) and embedding (cosine)
models alike; the model decides. Page images (`--image-documents a.png b.png`) are documents
for page retrieval models (ColModernVBert: MaxSim of the query against each page) and
image-text models (CLIP, SigLIP: cosine); they follow the text documents, in the order given.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from pooler.cli.common import add_engine_args, add_input_args, engine_from_args, read_texts


def add_parser(sub) -> None:
    score = sub.add_parser(
        "score", help="score documents against queries",
        description="Score (query, document) pairs: one --query against every document, or "
        "as many --query as documents (scored pairwise). One JSON line per pair: "
        "{query_index, document_index, score}.")
    _common(score)
    score.add_argument("--query", "-q", action="append", required=True,
                       help="a query; repeat it to score N queries against N documents")
    score.set_defaults(func=run_score)

    rerank = sub.add_parser(
        "rerank", help="rank documents by relevance to one query",
        description="Rank documents for one query, best first. One JSON line per document: "
        "{index, score, document}.")
    _common(rerank)
    rerank.add_argument("--query", "-q", required=True, help="the query")
    rerank.add_argument("--top-n", type=int, default=None, help="keep the best N documents")
    rerank.set_defaults(func=run_rerank)


def _common(parser) -> None:
    add_engine_args(parser)
    add_input_args(parser)  # documents: arguments, --input FILE, or stdin
    parser.add_argument("--image-documents", nargs="+", default=None, metavar="PATH",
                        help="page image files as documents (after any text documents), for "
                             "page retrieval (ColModernVBert) and image-text models; with "
                             "them, no text is read from stdin")
    parser.add_argument("--pool-factor", type=float, default=None,
                        help="ColBERT and page retrieval: pool each document's vectors to "
                             "about 1/N of them before MaxSim (hierarchical token pooling)")
    parser.add_argument("--long-input", default="truncate", choices=["truncate", "chunk"],
                        help="chunk: score a document longer than the model takes in windows "
                             "(each record then has num_windows)")
    parser.add_argument("--chunk-overlap", type=int, default=None,
                        help="with --long-input chunk: document tokens consecutive windows "
                             "share (default a quarter of a window)")
    parser.add_argument("--chunk-aggregate", default=None, choices=["max", "mean"],
                        help="with --long-input chunk: the best window's score (max, the "
                             "default) or the mean of the windows' scores")
    parser.add_argument("--output", "-o", default="-", help="'-' for stdout, or a .jsonl path")


def _documents(args) -> tuple[list, list[str]]:
    """Text documents then image documents (as paths), and the label of each."""
    images = list(args.image_documents or [])
    texts = read_texts(args) if (args.texts or args.input or not images) else []
    for path in images:
        if not Path(path).is_file():
            raise ValueError(f"--image-documents {path}: no such file.")
    return texts + [Path(p) for p in images], texts + images


def _options(args) -> dict:
    options = {} if args.pool_factor is None else {"pool_factor": args.pool_factor}
    if args.long_input != "truncate":
        options.update(long_input=args.long_input, chunk_overlap=args.chunk_overlap,
                       chunk_aggregate=args.chunk_aggregate)
    return options


def _windows(record: dict, output) -> dict:
    if output.num_windows is not None:  # --long-input chunk
        record["num_windows"] = output.num_windows
    return record


def run_score(args) -> int:
    documents, _ = _documents(args)
    engine = engine_from_args(args)
    queries = args.query[0] if len(args.query) == 1 else args.query
    outputs = engine.score(queries, documents, **_options(args))
    _write(args.output, (_windows({"query_index": o.query_index,
                                   "document_index": o.document_index,
                                   "score": round(o.score, 6)}, o) for o in outputs))
    return 0


def run_rerank(args) -> int:
    documents, labels = _documents(args)
    engine = engine_from_args(args)
    results = engine.rerank(args.query, documents, top_n=args.top_n, **_options(args))
    # "document": the text, or the image file's path as given
    _write(args.output, (_windows({"index": r.index, "score": round(r.score, 6),
                                   "document": labels[r.index]}, r) for r in results))
    return 0


def _write(destination: str, records) -> None:
    out = sys.stdout if destination == "-" else open(destination, "w", encoding="utf-8")
    try:
        for record in records:
            out.write(json.dumps(record) + "\n")
    finally:
        if out is not sys.stdout:
            out.close()
