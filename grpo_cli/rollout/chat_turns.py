"""The text between a model's turns, in the model's own chat format, and the tool calls in its turns.

Under env.token_mode=append a multi-turn trajectory is built from the token ids the model sampled;
only what the environment adds is tokenized, never the conversation as a whole (re-tokenizing decoded
text can change the model's tokens, and then the trained tokens are not the sampled ones). What an
environment adds after a model turn is the chat template's rendering of its messages, cut out of a
rendering of a fixed conversation after its assistant's content (`observation_text`), so ChatML's
`<|im_start|>` / `<|im_end|>`, the tiny model's `role: content` lines and templates that rewrite
earlier turns (Qwen3's) all work. Plain-text prompts (no chat) get the observation on lines of its
own. (fork and per_turn render the whole conversation instead: rollout/episodes.py.)

Tools are offered through the template's `tools=` (transformers turns type-hinted functions with
Google docstrings into JSON schemas). A template that ignores `tools=` (SmolLM2's, for one) gets
them described in a system message instead, in the `<tool_call>` JSON format of ChatML-family
models (Hermes, Qwen), which is also the format calls are parsed in.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from transformers.utils import get_json_schema

from grpo_cli.errors import GrpoError

TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_PROBE = [{"role": "user", "content": "\x00u"}, {"role": "assistant", "content": "\x00a"}]


def tool_schemas(tools: list[Callable[..., Any]]) -> list[dict[str, Any]]:
    """Each tool's JSON schema, from its type hints and Google docstring, naming the one that has none."""
    schemas = []
    for tool in tools:
        try:
            schemas.append(get_json_schema(tool))
        except Exception as err:  # transformers' TypeHintParsingException / DocstringParsingException
            name = getattr(tool, "__qualname__", repr(tool))
            raise GrpoError(
                f"tool {name}: {err} (a tool needs type hints on every argument and a Google docstring "
                "with an Args: section, as for TRL's tools)"
            ) from err
    return schemas


def tool_system_text(schemas: list[dict[str, Any]]) -> str:
    """The tools described for a template that does not render `tools=` itself (Hermes format)."""
    listed = "\n".join(json.dumps(schema["function"]) for schema in schemas)
    return (
        "You may call one or more functions to assist with the user query. The functions are:\n"
        f"<tools>\n{listed}\n</tools>\n"
        "To call a function, answer with a JSON object of its name and arguments within tags:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def renders_tools(tokenizer: Any, template_kwargs: dict[str, Any] | None = None) -> bool:
    """Whether the tokenizer's chat template shows `tools=` (a template may silently ignore it), as
    rendered with data.chat_template_kwargs (a template may show tools only in some of its modes)."""
    probe = [{"role": "user", "content": "hi"}]
    schema = [{"type": "function", "function": {"name": "grpo_probe_tool", "parameters": {"type": "object"}}}]
    rendered = tokenizer.apply_chat_template(
        probe, tools=schema, tokenize=False, add_generation_prompt=True, **(template_kwargs or {})
    )
    return "grpo_probe_tool" in rendered


def with_tool_description(messages: list[dict[str, Any]], schemas: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation with the tools described in its system message (added when it has none)."""
    text = tool_system_text(schemas)
    if messages and messages[0].get("role") == "system":
        return [{**messages[0], "content": f"{messages[0]['content']}\n\n{text}"}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def render_prompt(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    schemas: list[dict[str, Any]] | None,
    native: bool,
    template_kwargs: dict[str, Any] | None = None,
) -> str:
    """A conversational prompt as the model sees it, the tools offered where there are any:
    through `tools=` when the template renders them (`native`, from `renders_tools`), else described
    in the system message. `template_kwargs` (data.chat_template_kwargs) reach the template as its
    variables, e.g. Qwen3's enable_thinking."""
    extra = template_kwargs or {}
    if not schemas:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **extra)
    if native:
        return tokenizer.apply_chat_template(
            messages, tools=schemas, tokenize=False, add_generation_prompt=True, **extra
        )
    return tokenizer.apply_chat_template(
        with_tool_description(messages, schemas), tokenize=False, add_generation_prompt=True, **extra
    )


def observation_text(
    tokenizer: Any,
    observation: list[dict[str, Any]],
    chat: bool,
    eos_text: str,
    template_kwargs: dict[str, Any] | None = None,
) -> str:
    """The text that follows a model turn which ended with its EOS: the end of that turn as the
    template writes it (less the EOS the model sampled), the environment's messages, and the opening
    of the next assistant turn, rendered with the prompt's `template_kwargs` (data.chat_template_kwargs)
    so that a later turn opens as the first did. It is cut from a fixed conversation's rendering after
    its assistant's content, so a template that rewrites earlier turns (Qwen3's drops their reasoning)
    works too: under env.token_mode=append the model's own tokens stay as sampled. Without a chat
    template (plain prompts): each message's content on lines of its own."""
    if not chat:
        return "".join(f"\n{message['content']}\n" for message in observation)
    extra = template_kwargs or {}
    full = tokenizer.apply_chat_template([*_PROBE, *observation], tokenize=False, add_generation_prompt=True, **extra)
    marker = _PROBE[1]["content"]
    end = full.find(marker)
    if end < 0:
        raise GrpoError(
            "the chat template does not write an assistant message's content as it is, so the text between "
            "turns cannot be cut out of its rendering; multi-turn rollouts need such a template (ChatML and "
            "most others are)"
        )
    after = full[end + len(marker) :]
    if eos_text and after.startswith(eos_text):  # the model sampled that part already
        after = after[len(eos_text) :]
    return after


def parse_tool_calls(text: str) -> list[dict[str, Any]]:
    """The `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks of a model turn, in
    order; a block that is not such JSON is kept as {"error": ...} so the model is told why."""
    calls = []
    for block in TOOL_CALL.findall(text):
        try:
            call = json.loads(block)
        except json.JSONDecodeError as err:
            calls.append({"error": f"the tool call is not JSON ({err.msg} at character {err.pos})"})
            continue
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            calls.append({"error": 'a tool call needs {"name": ..., "arguments": {...}}'})
            continue
        arguments = call.get("arguments", {})
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                pass
        if not isinstance(arguments, dict):
            calls.append({"error": f"the arguments of {call['name']} are not a JSON object"})
            continue
        calls.append({"name": call["name"], "arguments": arguments})
    return calls
