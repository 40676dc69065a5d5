"""The engine's side of LoRA adapters: which families take them, the per-call choice
(`Engine.embed(..., lora="name")` and the other task methods), and adding / removing adapters
between steps. The adapters themselves live in the model runner (pooler/lora)."""
from __future__ import annotations

import functools
import inspect
from dataclasses import replace

from pooler import architectures
from pooler.engine.engine_loop import CallContext, current_call
from pooler.params import PoolingParams

# Model families whose linear layers adapters reach (pooler/layers/lora.py); the rest refuse
# lora_modules at start-up rather than serve an adapter half applied.
LORA_FAMILIES = ("bert", "distilbert", "mpnet", "electra", "modernbert")


class UnknownLoraError(ValueError):
    """A request named an adapter this engine does not serve (the server answers 404)."""

    def __init__(self, name: str, known: list[str]):
        self.name, self.known = name, known
        super().__init__(f"The LoRA adapter {name!r} is not loaded; loaded adapters: "
                         f"{known or 'none'}. Load it first (lora_modules= / --lora-modules / "
                         "POST /v1/load_lora_adapter).")


def check_family(family: str, runner: str) -> None:
    if runner == "transformers":
        raise ValueError("LoRA adapters need the native runner; drop runner='transformers' "
                         "(--runner transformers).")
    if family not in LORA_FAMILIES:
        raise ValueError(f"LoRA adapters are served on the {list(LORA_FAMILIES)} families; "
                         f"this model's family is {family!r}. Merge the adapter into the base "
                         "(peft's merge_and_unload) and serve the merged model instead.")


def start_adapters(core, model_config, lora_modules: dict[str, str] | None, max_loras: int,
                   max_lora_rank: int):
    """The model runner's adapter manager, `lora_modules` ({name: PEFT folder}) loaded;
    a ValueError where the model's family takes no adapters."""
    check_family(architectures.get_arch_spec(model_config.architecture).family
                 if model_config.runner != "transformers" else "", model_config.runner)
    manager = core.model_runner.enable_lora(max_loras, max_lora_rank)
    for name, path in (lora_modules or {}).items():
        manager.add(name, path)
    return manager


def start_task_adapters(core, model_config):
    """The model runner's adapter manager serving the task adapters the model folder carries
    (Jina v3's, pooler/lora/task_adapters.py), or None when it carries none."""
    from pooler.lora.manager import DEFAULT_MAX_LORA_RANK, DEFAULT_MAX_LORAS
    from pooler.lora.task_adapters import read_task_adapters

    model = getattr(core.model_runner, "model", None)
    if model_config.runner == "transformers" or model is None:
        return None
    adapters = read_task_adapters(model, model_config.hf_config, model_config.path)
    if not adapters:
        return None
    manager = core.model_runner.enable_lora(DEFAULT_MAX_LORAS, DEFAULT_MAX_LORA_RANK)
    for adapter in adapters:
        manager.add_builtin(adapter)
    return manager


def on_adapter(params: PoolingParams, lora: str) -> PoolingParams:
    """`params` for the adapter `lora` (a copy unless they already name it)."""
    if params.lora == lora:
        return params
    params = params.clone()
    params.lora = lora
    return params


def with_lora(method):
    """Give an Engine task method a `lora` keyword: every request the call submits runs with
    that adapter (run_processed reads it from the call's CallContext)."""
    @functools.wraps(method)
    def wrapper(self, *args, lora: str | None = None, **kwargs):
        if lora is None:
            return method(self, *args, **kwargs)
        self.check_lora(lora)
        call = current_call.get()
        token = current_call.set(CallContext(lora=lora) if call is None
                                 else replace(call, lora=lora))
        try:
            return method(self, *args, **kwargs)
        finally:
            current_call.reset(token)

    signature = inspect.signature(method)
    params = list(signature.parameters.values())
    at = next((i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_KEYWORD),
              len(params))
    params.insert(at, inspect.Parameter("lora", inspect.Parameter.KEYWORD_ONLY, default=None,
                                        annotation="str | None"))
    wrapper.__signature__ = signature.replace(parameters=params)
    return wrapper


def with_task_adapter(method):
    """Give an Engine task method a `task` keyword, as jina-embeddings-v3's own
    `encode(task=...)` and sentence-transformers' `encode(..., task=...)` take it: the model's
    task adapter of that name (Engine.task_adapters), and, unless the call passes `prompt` or
    `prompt_name`, the instruction the model's config.json gives that task
    (`task_instructions`). Calls with different tasks share the same batches."""
    takes_prompt = "prompt" in inspect.signature(method).parameters

    @functools.wraps(method)
    def wrapper(self, *args, task: str | None = None, **kwargs):
        if task is None:
            return method(self, *args, **kwargs)
        self.check_task_adapter(task)
        call = current_call.get()
        chosen = kwargs.get("lora") or (call.lora if call is not None else None)
        if chosen is not None and chosen != task:
            raise ValueError(f"task={task!r} asks for the task adapter {task!r}, but the "
                             f"request already names the adapter {chosen!r} (lora / model); "
                             "name one of them.")
        if takes_prompt and kwargs.get("prompt") is None and kwargs.get("prompt_name") is None:
            instruction = self.task_instructions.get(task)
            if instruction:
                kwargs["prompt"] = instruction
        kwargs["lora"] = task
        return method(self, *args, **kwargs)

    signature = inspect.signature(method)
    params = list(signature.parameters.values())
    at = next((i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_KEYWORD),
              len(params))
    params.insert(at, inspect.Parameter("task", inspect.Parameter.KEYWORD_ONLY, default=None,
                                        annotation="str | None"))
    wrapper.__signature__ = signature.replace(parameters=params)
    return wrapper


# ---- Engine's adapter admin, attached to Engine one line each (engine first) --------------
def lora_enabled(engine) -> bool:
    """Whether adapters can be loaded by name (lora_modules / enable_lora)."""
    return engine._user_lora


def lora_names(engine) -> list[str]:
    """The LoRA adapters served beside the base, by name."""
    return [] if engine._lora_manager is None else engine._lora_manager.names


def task_adapters(engine) -> list[str]:
    """The task adapters the model folder carries (Jina v3: retrieval.query,
    retrieval.passage, separation, classification, text-matching), each served per
    request: `embed(..., task=name)`, or by name like a LoRA adapter."""
    manager = engine._lora_manager
    return [] if manager is None else list(manager.builtin)


def task_instructions(engine) -> dict[str, str]:
    """The text config.json puts before an input for each task adapter (`task=`)."""
    from pooler.lora.task_adapters import task_instructions as read_instructions
    return read_instructions(engine.model_config.hf_config)


def check_task_adapter(engine, task: str) -> None:
    """ValueError unless `task` names one of the model's task adapters."""
    if task in engine.task_adapters:
        return
    if not engine.task_adapters:
        raise ValueError(f"task={task!r}: this model carries no task adapters (`task` "
                         "picks one of jina-embeddings-v3's LoRA task adapters); leave "
                         "it out.")
    raise ValueError(f"task={task!r} is not one of this model's task adapters "
                     f"{engine.task_adapters}.")


def check_lora(engine, name: str) -> None:
    """UnknownLoraError (a ValueError naming the loaded ones) unless `name` is served."""
    if name not in engine.lora_names:
        raise UnknownLoraError(name, engine.lora_names)


def add_lora(engine, name: str, path: str, replace: bool = False) -> None:
    """Serve the PEFT LoRA folder at `path` as `name`, from the next step on (replace: in
    place of an adapter of that name). A ValueError naming the mismatch refuses an
    adapter made for another base, or whose ranks do not fit; nothing served changes."""
    if not engine._user_lora:
        raise ValueError("this engine serves no LoRA adapters; create it with "
                         "lora_modules={...} or enable_lora=True (--enable-lora).")
    engine._between_steps(lambda: engine._lora_manager.add(name, path, replace))


def remove_lora(engine, name: str) -> None:
    """Stop serving `name` (requests still queued for it fail naming it)."""
    engine.check_lora(name)
    engine._between_steps(lambda: engine._lora_manager.remove(name))
