"""The package's import graph: no cycles, and every import points down the layer stack.

Layers, top to bottom (docs/architecture.md): entry points -> engine -> worker -> pooling /
models -> layers -> base (config, model folder, params, outputs, ...). Every import counts:
module level, inside functions, and under TYPE_CHECKING. Every subpackage needs a layer, and
inside the server each part (dialects/, grpc/, observability/, edges/, the core modules)
imports only the parts its SERVER_IMPORTS row names.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pooler

PACKAGE_DIR = Path(pooler.__file__).parent

# Subpackage (or top-level module) -> layer; higher numbers sit higher in the stack.
LAYERS = {
    "cli": 5, "server": 5, "bench": 5, "batch": 5, "ray": 5, "__main__": 5,
    "engine": 4,
    "worker": 3, "loader": 3, "lora": 3,
    "pooling": 2, "models": 2,
    "layers": 1, "kernels": 1,
    # Media input (decode, hash, preprocess, byte-bounded caches): base, below the worker.
    "multimodal": 0,
}
BASE = 0  # any other top-level module: config, model_folder, params, outputs, tokenizer, ...

# Inside the server (docs/architecture.md, "The server"): each part -> the server parts it may
# import (its own included). A part is a subpackage of pooler/server or a core module at its
# top. The entry (app, multi_model) wires everything; gRPC runs over the TEI dialect; the
# dialects answer through the shared state; the state guards calls with the edges and reports
# them to observability; edges shape early refusals per dialect (their path table, TEI's and
# vLLM's error shapes), which import nothing of the edges back; observability hears about a
# request only when it is finished and imports nothing but the error codes.
SERVER_CORE = {"errors", "protocol", "settings", "asgi_call"}  # import no other server module
SERVER_IMPORTS = {
    "app": {"state", "dialects", "grpc", "observability", "edges", "openapi_spec"} | SERVER_CORE,
    "multi_model": {"asgi_call", "observability"},
    "grpc": {"dialects", "asgi_call"},
    "openapi_spec": {"dialects"},
    "dialects": {"state", "errors", "protocol", "media"},
    "state": {"edges", "observability", "errors", "settings", "media"},
    # Images named in requests: fetched and decoded off the event loop (media.py).
    "media": {"errors", "settings"},
    "edges": {"dialects", "errors"},
    "observability": {"errors"},
    **{core: set() for core in SERVER_CORE},
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _layer(module: str) -> int:
    parts = module.split(".")
    if len(parts) == 1:  # the package root re-exports the public API: the very top
        return 6
    return LAYERS.get(parts[1], BASE)


def _import_graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in PACKAGE_DIR.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        is_package = path.name == "__init__.py"
        package = module if is_package else module.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                # `from pooler.engine import scoring` imports the submodule, not the package.
                names = [f"{source}.{a.name}" if f"{source}.{a.name}" in files else source
                         for a in node.names]
            else:
                continue
            targets.update(n for n in names if n in files and n != module)
        graph[module] = targets
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _server_part(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) < 3 or parts[1] != "server":
        return None
    return parts[2]


def test_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_graph_sees_deferred_and_type_checking_imports():
    graph = _import_graph()
    # pooler/engine/tasks/ imports these only inside functions.
    assert "pooler.pooling.sparse" in graph["pooler.engine.tasks.sparse"]
    assert "pooler.engine.colbert_inputs" in graph["pooler.engine.tasks.late_interaction"]


def test_no_import_cycles():
    assert _cycles(_import_graph()) == []


def test_imports_only_point_down():
    upward = [f"{m} (layer {_layer(m)}) imports {t} (layer {_layer(t)})"
              for m, targets in sorted(_import_graph().items()) for t in sorted(targets)
              if _layer(t) > _layer(m)]
    assert upward == [], "\n".join(upward)


def test_worker_depends_on_the_step_contract_not_the_scheduler():
    graph = _import_graph()
    for module, targets in graph.items():
        if module.startswith("pooler.worker."):
            assert "pooler.engine.scheduler" not in targets, module
    assert "pooler.step_contract" in graph["pooler.worker.model_runner"]
    assert "pooler.step_contract" in graph["pooler.engine.scheduler"]


def test_every_subpackage_has_a_layer():
    subpackages = {p.parent.name for p in PACKAGE_DIR.glob("*/__init__.py")}
    assert subpackages - set(LAYERS) == set(), "give each new subpackage a layer in LAYERS"
    server_parts = {p.stem if p.suffix == ".py" else p.name
                    for p in (PACKAGE_DIR / "server").iterdir()
                    if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()}
    assert server_parts ^ set(SERVER_IMPORTS) == set(), "give each server part a SERVER_IMPORTS row"


def test_server_parts_import_only_what_the_layout_allows():
    wrong = []
    for module, targets in sorted(_import_graph().items()):
        part = _server_part(module)
        if part is None:
            continue
        allowed = SERVER_IMPORTS[part] | {part}
        wrong += [f"{module} ({part}) imports {t}" for t in sorted(targets)
                  if _server_part(t) is not None and _server_part(t) not in allowed]
    assert wrong == [], "\n".join(wrong)


def test_generated_grpc_stubs_import_only_each_other():
    graph = _import_graph()
    generated = "pooler.server.grpc.generated"
    stubs = [m for m in graph if m.startswith(generated + ".")]
    assert stubs, "the TEI stubs moved: update this test and docs/architecture.md"
    for module in stubs:
        assert {t for t in graph[module] if not t.startswith(generated)} == set(), module
    # Only the gRPC server (and nothing outside grpc/) uses them.
    users = {m for m, targets in graph.items() if m not in stubs
             and any(t.startswith(generated) for t in targets)}
    assert users == {"pooler.server.grpc.server"}
