"""`data.*`: where the prompts come from and how they are cut and split."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

LONG_PROMPT_POLICIES = ("truncate_left", "skip", "error")  # data.on_long_prompt


@dataclass
class DataConfig:
    kind: str = "arithmetic"  # arithmetic | jsonl | math | code | hf
    # jsonl: the file of rows; hf: a parquet/csv/json/jsonl/arrow file, a directory (save_to_disk's, or
    # of data files) or a hub id in the local datasets cache; arithmetic | math | code: unused
    path: str | None = None
    prompt_field: str = "prompt"  # the column that holds the prompt (text, or a list of chat messages)
    # jsonl | hf: the column that holds the reference answer; it reaches the rewards as `answer` and
    # under its own name (e.g. solution, as TRL's accuracy_reward reads it)
    answer_field: str = "answer"
    split: str = "train"  # hf: the data set's split to read (train, test, ...); eval holds out data.eval_fraction of it
    subset: str | None = None  # hf: a hub data set's configuration (load_dataset's name), e.g. main for openai/gsm8k
    num_examples: int = 2000  # arithmetic: distinct problems to draw, >= 1 (capped by how many exist)
    max_operand: int = 9  # arithmetic: operands are 0..max_operand, >= 0
    operations: list[str] = field(default_factory=lambda: ["+"])  # arithmetic: one or more of + - *
    max_examples: int = 0  # cap after loading, >= 0; 0: all
    eval_fraction: float = 0.1  # share held out for eval, in [0, 1)
    fraction: float = 1.0  # use the first share of the data, in (0, 1]: quick experiments
    max_prompt_tokens: int = 64  # >= 1; clamped at start-up to the model's context minus rollout.max_new_tokens
    on_long_prompt: str = "truncate_left"  # truncate_left | skip | error: a prompt over max_prompt_tokens
    template: str | None = None  # a format string over each row's columns that becomes its prompt
    chat: bool = False  # send each text prompt as one user message, through the tokenizer's chat template
    seed: int = 0  # problem order and the train/eval split
    # keyword arguments of every chat-template rendering of a prompt and of multi-turn's text between
    # turns, e.g. {enable_thinking: false} for Qwen3 (TRL's chat_template_kwargs); needs chat prompts
    # (data.chat=true or lists of messages). The renderer's own (tools, add_generation_prompt, ...) are refused
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
