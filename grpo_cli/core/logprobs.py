"""Per-token log-probabilities of completions under a model."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel


def completion_logprobs(
    model: PreTrainedModel,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    temperature: float = 1.0,
) -> torch.Tensor:
    """log pi(y_t | x, y_<t) for every completion token, [B, C], in float32.

    Logits are divided by the sampling temperature so the ratio compares the distribution the
    tokens were actually drawn from (as TRL does). Position ids follow the attention mask so
    left padding does not shift positions.
    """
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    c = completion_ids.size(1)
    logits = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        logits_to_keep=c + 1,
        use_cache=False,
    ).logits[:, :-1, :]
    logits = logits.float() / temperature
    return torch.gather(logits.log_softmax(-1), 2, completion_ids.unsqueeze(-1)).squeeze(-1)
