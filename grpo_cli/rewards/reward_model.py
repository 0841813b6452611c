"""A local sequence-classification reward model behind the plain reward signature.

torch and transformers are imported when a scorer is built, not with this module: worker
processes import `grpo_cli.rewards` to run plain functions and should start in a blink.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grpo_cli.errors import GrpoError


class RewardModelScorer:
    """`scorer(prompts, completions, **columns) -> list[float]`: the model's first logit for each
    prompt + completion (a Bradley-Terry reward model has exactly one).

    Conversational prompts (lists of messages) go through the tokenizer's chat template with the
    completion as the assistant message; plain prompts are concatenated with the completion.
    """

    def __init__(self, path: str | Path, device: str | None = "auto", batch_size: int = 16) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.path = str(path)
        self.batch_size = max(1, int(batch_size))
        from grpo_cli.models import pick_device  # torch and transformers only when a model is configured

        self.device = pick_device(device)
        if not Path(self.path).is_dir():
            raise GrpoError(f"reward model '{self.path}': no such directory")
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(self.path)
            model = AutoModelForSequenceClassification.from_pretrained(self.path, dtype="auto")
        except Exception as err:  # transformers raises OSError, ValueError, KeyError... for a bad directory
            raise GrpoError(f"reward model '{self.path}': cannot load: {err}") from None
        if self.tokenizer.pad_token is None:  # many decoder-only reward models ship without one
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if model.config.pad_token_id is None:  # the head finds each row's last token by the pad id
            model.config.pad_token_id = self.tokenizer.pad_token_id
        # Right padding and left truncation: the score is read at the last real token, and an
        # over-long text keeps its end, which holds the completion being judged.
        self.tokenizer.padding_side = "right"
        self.tokenizer.truncation_side = "left"
        self.max_length = getattr(model.config, "max_position_embeddings", None)
        self.model = model.to(self.device).eval().requires_grad_(False)
        self._inference_mode = torch.inference_mode

    def _text(self, prompt: Any, completion: Any) -> str:
        if isinstance(prompt, list):
            answer = completion if isinstance(completion, list) else [{"role": "assistant", "content": completion}]
            return self.tokenizer.apply_chat_template(prompt + answer, tokenize=False)
        return f"{prompt}{completion}"

    def __call__(self, prompts: list[Any], completions: list[Any], **columns: Any) -> list[float]:
        texts = [self._text(p, c) for p, c in zip(prompts, completions)]
        # A chat template writes its own special tokens; plain text gets the tokenizer's.
        add_special = not any(isinstance(p, list) for p in prompts)
        scores: list[float] = []
        with self._inference_mode():
            for start in range(0, len(texts), self.batch_size):
                enc = self.tokenizer(
                    texts[start : start + self.batch_size],
                    padding=True,
                    truncation=self.max_length is not None,
                    max_length=self.max_length,
                    add_special_tokens=add_special,
                    return_tensors="pt",
                ).to(self.device)
                logits = self.model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits
                scores.extend(logits[:, 0].float().tolist())
        return scores

    def __repr__(self) -> str:
        return f"RewardModelScorer({self.path!r}, device={str(self.device)!r}, batch_size={self.batch_size})"
