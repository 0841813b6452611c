"""Prompts to token ids: the chat template, left truncation, and the fit to the model's context.

A prompt plus its completion must fit the model's positions (the tiny model has 256); past that a
model silently extrapolates or fails deep inside attention. So the prompt budget is clamped to
the context at start-up and every long prompt is handled the way `data.on_long_prompt` says.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from grpo_cli.config.schema import LONG_PROMPT_POLICIES, DataConfig
from grpo_cli.errors import GrpoError
from grpo_cli.rollout.chat_turns import render_prompt, renders_tools

log = logging.getLogger("grpo")


class PromptEncoder:
    """Conversational prompts go through the chat template, with `chat_template_kwargs`
    (data.chat_template_kwargs) as its variables; plain strings are used as they are. A prompt over
    `max_tokens` keeps its last tokens: that is where the question is."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        max_tokens: int,
        device: torch.device,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        self.device = device
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        # data.on_long_prompt, which fit_prompts sets: an environment's reset can make a prompt long at run time
        self.on_long_prompt = DataConfig.on_long_prompt
        self.tool_schemas: list[dict[str, Any]] | None = None  # an environment's tools, offered to the model
        self.template_renders_tools = False  # whether the chat template shows tools= itself (offer_tools)

    def _texts(self, prompts: list[Any]) -> tuple[list[str], bool]:
        conversational = [isinstance(p, list) for p in prompts]
        texts = [
            render_prompt(self.tokenizer, p, self.tool_schemas, self.template_renders_tools, self.chat_template_kwargs)
            if conv
            else p
            for p, conv in zip(prompts, conversational)
        ]
        return texts, not any(conversational)  # a chat template carries its own special tokens

    def offer_tools(self, schemas: list[dict[str, Any]]) -> None:
        """Every conversational prompt offers these tools from now on; the template is probed once."""
        self.tool_schemas = schemas or None
        self.template_renders_tools = bool(schemas) and renders_tools(self.tokenizer, self.chat_template_kwargs)

    def token_counts(self, prompts: list[Any]) -> list[int]:
        texts, special = self._texts(prompts)
        return [len(ids) for ids in self.tokenizer(texts, add_special_tokens=special)["input_ids"]]

    def token_ids(self, prompt: Any) -> list[int]:
        """One prompt's ids, whole (no budget cut): a later turn's conversation as the template renders
        it (env.token_mode=fork), which the episode's budget bounds instead."""
        texts, special = self._texts([prompt])
        return self.tokenizer(texts[0], add_special_tokens=special)["input_ids"]

    def __call__(self, prompts: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        texts, special = self._texts(prompts)
        enc = self.tokenizer(texts, padding=True, return_tensors="pt", add_special_tokens=special)
        ids, mask = enc["input_ids"], enc["attention_mask"]
        if ids.size(1) > self.max_tokens:
            ids, mask = ids[:, -self.max_tokens :], mask[:, -self.max_tokens :]
        return ids.to(self.device), mask.to(self.device)


@dataclass
class PromptBudget:
    """What start-up decided about prompt lengths: logged, and written to summary.json."""

    max_prompt_tokens: int  # after clamping to the context
    context_length: int | None  # the model's positions; None when its config does not say
    long_prompts: int  # prompts over max_prompt_tokens in the data (train + eval)
    truncated_prompts: int  # of those, kept with their first tokens cut (truncate_left)
    skipped_prompts: int  # of those, dropped (skip)

    def summary(self) -> dict[str, int | None]:
        return {
            "max_prompt_tokens": self.max_prompt_tokens,
            "prompts_truncated": self.truncated_prompts,
            "prompts_skipped": self.skipped_prompts,
        }


def context_length(model: torch.nn.Module) -> int | None:
    """The model's positions, from its Hugging Face config (None when it does not say)."""
    value = getattr(getattr(model, "config", None), "max_position_embeddings", None)  # a transformers config
    return int(value) if isinstance(value, int) and value > 0 else None


def prompt_budget(max_prompt_tokens: int, max_new_tokens: int, context: int | None) -> int:
    """data.max_prompt_tokens, lowered (with a warning) where it and the completion would not fit
    the model's context together; an error where the completion alone fills it."""
    if context is None:
        return max_prompt_tokens
    if max_new_tokens >= context:
        raise GrpoError(
            f"rollout.max_new_tokens={max_new_tokens} leaves no room for a prompt in the model's context "
            f"of {context} tokens"
        )
    if max_prompt_tokens + max_new_tokens <= context:
        return max_prompt_tokens
    budget = context - max_new_tokens
    log.warning(
        "data.max_prompt_tokens=%d + rollout.max_new_tokens=%d exceeds the model's context of %d "
        "tokens: prompts are limited to %d tokens",
        max_prompt_tokens,
        max_new_tokens,
        context,
        budget,
    )
    return budget


def fit_prompts(
    splits: dict[str, list[dict[str, Any]]],
    encoder: PromptEncoder,
    max_prompt_tokens: int,
    max_new_tokens: int,
    context: int | None,
    on_long_prompt: str,
) -> tuple[dict[str, list[dict[str, Any]]], PromptBudget]:
    """Clamp the prompt budget to `context - max_new_tokens`, then apply the long-prompt policy to
    every split ({"train": [...], "eval": [...]}); sets `encoder.max_tokens` to the budget."""
    if on_long_prompt not in LONG_PROMPT_POLICIES:
        raise GrpoError(f"data.on_long_prompt={on_long_prompt!r}: must be one of {', '.join(LONG_PROMPT_POLICIES)}")
    budget = encoder.max_tokens = prompt_budget(max_prompt_tokens, max_new_tokens, context)
    encoder.on_long_prompt = on_long_prompt
    prompts = [ex["prompt"] for examples in splits.values() for ex in examples]
    if encoder.chat_template_kwargs and prompts and not any(isinstance(p, list) for p in prompts):
        raise GrpoError(
            f"data.chat_template_kwargs={encoder.chat_template_kwargs}: no prompt goes through the chat "
            "template (every one is plain text): set data.chat=true, or give prompts as lists of messages"
        )
    kept: dict[str, list[dict[str, Any]]] = {}
    long_total = skipped = 0
    for name, examples in splits.items():
        counts = encoder.token_counts([ex["prompt"] for ex in examples]) if examples else []
        long = [i for i, n in enumerate(counts) if n > budget]
        long_total += len(long)
        if long and on_long_prompt == "error":
            worst = max(long, key=lambda i: counts[i])
            raise GrpoError(
                f"{len(long)} of {len(examples)} {name} prompts are longer than {budget} tokens (the longest, "
                f"#{worst}, has {counts[worst]}); raise data.max_prompt_tokens (context {context}), or set "
                "data.on_long_prompt=truncate_left or skip"
            )
        if on_long_prompt == "skip":
            dropped = set(long)
            examples = [ex for i, ex in enumerate(examples) if i not in dropped]
            skipped += len(dropped)
        kept[name] = examples
    if long_total:
        action = "skipped" if on_long_prompt == "skip" else "truncated from the left"
        log.warning("%d prompts are longer than %d tokens: %s (data.on_long_prompt)", long_total, budget, action)
    if splits.get("train") and not kept.get("train"):
        raise GrpoError(f"every training prompt is longer than {budget} tokens: nothing left to train on")
    truncated = long_total - skipped
    return kept, PromptBudget(budget, context, long_total, truncated, skipped)
