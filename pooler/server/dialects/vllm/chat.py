"""Chat `messages` -> one prompt string, with the model's chat template (the `chat_template`
of tokenizer_config.json, or a chat_template.jinja beside it), rendered with jinja2 as
transformers' apply_chat_template renders it: sandboxed, trim_blocks / lstrip_blocks, the
tokenizer's special tokens and `add_generation_prompt` in scope. vLLM's pooling routes take
`messages` this way and tokenize the prompt with add_special_tokens=False by default.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                   "mask_token")


class ChatTemplateError(ValueError):
    pass


def model_chat_template(tokenizer_config: dict, folder: Path) -> str | None:
    template = tokenizer_config.get("chat_template")
    if isinstance(template, list):  # named templates: the "default" one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if not template and (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text()
    return template or None


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):  # {"content": "[CLS]", ...} in older tokenizer configs
        return value.get("content")
    return value if isinstance(value, str) else None


def _raise(message: str):
    raise ChatTemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


@functools.lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    return env.from_string(template)


def _text_of(content: Any, index: int) -> str:
    """A message's content: a string, or a list of {"type": "text", "text": ...} parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text"
                    and isinstance(part.get("text"), str)):
                raise ChatTemplateError(f"messages[{index}].content: only text parts "
                                        "({'type': 'text', 'text': ...}) are supported.")
            texts.append(part["text"])
        return "\n".join(texts)
    raise ChatTemplateError(f"messages[{index}].content must be a string or a list of text "
                            "parts.")


def render_chat(messages: list[dict], template: str | None, tokenizer_config: dict, *,
                add_generation_prompt: bool = False, continue_final_message: bool = False,
                template_kwargs: dict | None = None, tools: list | None = None) -> str:
    if not template:
        raise ChatTemplateError(
            "This model has no chat template (no chat_template in its tokenizer_config.json); "
            "send `input` text instead of `messages`, or pass `chat_template`.")
    if continue_final_message and add_generation_prompt:
        raise ChatTemplateError("Cannot set both `continue_final_message` and "
                                "`add_generation_prompt` to True.")
    if not messages:
        raise ChatTemplateError("messages is empty: pass at least one message.")
    conversation = [{**m, "content": _text_of(m.get("content"), i)}
                    for i, m in enumerate(messages)]
    context = {name: _token_text(tokenizer_config.get(name)) for name in _SPECIAL_TOKENS}
    context.update(template_kwargs or {})
    try:
        prompt = _compile(template).render(messages=conversation, tools=tools,
                                           add_generation_prompt=add_generation_prompt,
                                           **context)
    except ChatTemplateError:
        raise
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"The chat template failed to render: {exc}") from None
    if continue_final_message:
        # End the prompt right after the last message, leaving it open (transformers' rule).
        final = conversation[-1]["content"]
        for needle in (final, final.strip()):
            if needle and needle in prompt:
                return prompt[: prompt.rindex(needle) + len(needle)]
        raise ChatTemplateError("continue_final_message: the last message's content does not "
                                "appear in the rendered prompt.")
    return prompt
