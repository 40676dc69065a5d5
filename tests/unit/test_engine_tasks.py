"""The thin Engine: task families live in pooler/engine/tasks/, attached as Engine methods,
and take the engine through the TaskEngine protocol (they never import llm.py)."""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pooler.engine.tasks as tasks_pkg
from pooler.engine.llm import Engine

TASK_METHODS = ("embed", "token_embed", "encode", "embed_chunks", "classify", "token_classify",
                "ner", "score", "rerank", "encode_queries", "encode_documents",
                "embed_sparse", "embed_bge_m3", "score_bge_m3")


def test_task_modules_never_import_the_engine():
    for path in Path(tasks_pkg.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.startswith("pooler.engine.llm") for n in names), path.name


def test_task_methods_come_from_task_modules_with_a_lora_keyword_and_no_engine_argument():
    for name in TASK_METHODS:
        method = getattr(Engine, name)
        assert method.__module__.startswith("pooler.engine.tasks."), name
        bound = inspect.signature(method.__get__(object()))
        assert "engine" not in bound.parameters, name
        assert bound.parameters["lora"].kind is inspect.Parameter.KEYWORD_ONLY, name
        assert method.__doc__, name
