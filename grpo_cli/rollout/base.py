"""What a generation backend returns, and the one interface it implements."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch

# (tokens sampled so far by the longest completion, rollout.max_new_tokens): called while sampling,
# for a progress display (a real model's first step takes minutes)
TokenProgress = Callable[[int, int], None]


@dataclass
class Fork:
    """A later training row of a multi-turn episode (env.token_mode=fork | per_turn): the model's next
    turn was given ids (`prompt`) that do not extend the episode's row so far, e.g. a chat template
    that drops earlier reasoning. It trains with its episode's advantage; its tokens count in the
    episode's length."""

    episode: int  # the Rollout row (the episode's main row) it belongs to
    prompt: list[int]  # every id the model was given before the row's first turn
    tokens: list[int]  # what followed, the model's and the environment's
    sampled: list[int]  # 1 on the model's tokens
    engine_logps: list[float]  # the sampler's log-probs of the model's tokens (0 elsewhere)


@dataclass
class Rollout:
    """G completions per prompt, laid out group by group (rows g*G .. g*G+G-1 share a data prompt;
    an environment's reset may add text of its own to each row's, so `prompt_ids` may differ)."""

    prompt_ids: torch.Tensor  # [N, P] left-padded
    prompt_mask: torch.Tensor  # [N, P]
    completion_ids: torch.Tensor  # [N, C] right-padded after EOS
    completion_mask: torch.Tensor  # [N, C] 1 up to and including the first EOS
    truncated: torch.Tensor  # [N] bool: no EOS within max_new_tokens
    texts: list[str]  # decoded completions, EOS and padding removed
    group_size: int  # G: rows g*G .. g*G+G-1 share a data prompt
    # [N, C] log-probs of the sampled tokens under the engine that sampled them, where that engine
    # is not the policy itself (vLLM): algo.rollout_correction weighs by pi_policy / pi_engine
    engine_logps: torch.Tensor | None = None
    # Multi-turn rollouts (env.*): [N, C] 1 on the tokens the model sampled, 0 on the
    # environment's (tool results, feedback) and on padding. None: every real completion token is the
    # model's (completion_mask). The loss, the KL, the entropy and every denominator read `model_mask`;
    # attention reads completion_mask, so the environment's tokens are context the model sees.
    sampled_mask: torch.Tensor | None = None
    messages: list[list[dict[str, Any]]] | None = None  # each row's conversation after the prompt, as chat messages
    env_columns: dict[str, list[Any]] | None = None  # per-row values the environment reports, as reward columns
    # each row's environment instance (env=trl: the user's class), live objects for the rewards that name
    # TRL's `environments` keyword; never written to a file
    environments: list[Any] | None = None
    forks: list[Fork] | None = None  # rows after each episode's first (env.token_mode): trained, not scored

    def fork_counts(self) -> list[int]:
        """Each row's tokens the model sampled in its episode's later rows (0 without forks)."""
        counts = [0] * len(self.texts)
        for fork in self.forks or []:
            counts[fork.episode] += sum(fork.sampled)
        return counts

    @property
    def model_mask(self) -> torch.Tensor:
        """[N, C] 1 on the tokens the model sampled: what is trained on."""
        return self.completion_mask if self.sampled_mask is None else self.sampled_mask

    @property
    def lengths(self) -> torch.Tensor:
        """Tokens the model sampled per episode (EOS included, its later rows' too): the lengths rewards
        and metrics read."""
        lengths = self.model_mask.sum(-1)
        return lengths if self.forks is None else lengths + torch.tensor(self.fork_counts(), device=lengths.device)

    def select(self, rows: torch.Tensor, group_size: int) -> Rollout:
        """These rows only (whole groups, or one group of them), e.g. a batch without a group."""
        return Rollout(
            self.prompt_ids[rows],
            self.prompt_mask[rows],
            self.completion_ids[rows],
            self.completion_mask[rows],
            self.truncated[rows],
            [self.texts[i] for i in rows.tolist()],
            group_size,
            self.engine_logps[rows] if self.engine_logps is not None else None,
            self.sampled_mask[rows] if self.sampled_mask is not None else None,
            [self.messages[i] for i in rows.tolist()] if self.messages is not None else None,
            {k: [v[i] for i in rows.tolist()] for k, v in self.env_columns.items()} if self.env_columns else None,
            [self.environments[i] for i in rows.tolist()] if self.environments is not None else None,
            self._selected_forks(rows.tolist()),
        )

    def _selected_forks(self, rows: list[int]) -> list[Fork] | None:
        if self.forks is None:
            return None
        new = {old: i for i, old in enumerate(rows)}
        kept = [replace(f, episode=new[f.episode]) for f in self.forks if f.episode in new]
        return kept or None

    def token_lists(self) -> list[list[int]]:
        """Each completion's sampled token ids without padding (EOS kept): what diversity is measured on."""
        ids, keep = self.completion_ids.tolist(), self.model_mask.tolist()
        lists = [[t for t, k in zip(row, m) if k] for row, m in zip(ids, keep)]
        for fork in self.forks or []:
            lists[fork.episode] += [t for t, k in zip(fork.tokens, fork.sampled) if k]
        return lists


class Generator(Protocol):
    on_token: TokenProgress | None  # set by a caller that shows progress; a loop that cannot tell ignores it

    def generate(
        self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, num_generations: int, greedy: bool = False
    ) -> Rollout: ...

    def weights_updated(self) -> None:
        """The optimizer moved the policy's weights: a generator holding its own copy refreshes it."""
        ...

    def set_step_seed(self, seed: int) -> None:
        """A training step begins, with its sampling seed (`World.sampling_seed`, a function of
        (train.seed, step, rank)): a generator with a random stream of its own (vLLM's engine, which
        no checkpoint saves) seeds each of the step's requests from it, so a resumed run and every
        process draw what they should. The hf loops draw from torch's stream, which the trainer
        saves (`RngState`) and, data-parallel, reseeds each step itself."""
        ...

    def close(self) -> None:
        """Release what the loop holds beyond the policy (vLLM: the engine's processes and memory,
        the shared weights file), so the next job of a multirun or a test starts without them."""
        ...


def completion_mask_from_eos(completion_ids: torch.Tensor, eos_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(mask, truncated): the mask keeps tokens up to and including the first EOS.

    >>> m, t = completion_mask_from_eos(torch.tensor([[5, 2, 0], [5, 6, 7]]), [2])
    >>> m.tolist(), t.tolist()
    ([[1, 1, 0], [1, 1, 1]], [False, True])
    """
    is_eos = torch.isin(completion_ids, torch.tensor(eos_ids, device=completion_ids.device))
    length = completion_ids.size(1)
    positions = torch.arange(length, device=completion_ids.device).expand_as(completion_ids)
    first_eos = torch.where(is_eos, positions, length).amin(1, keepdim=True)
    mask = (positions <= first_eos).long()
    return mask, ~is_eos.any(1)


def finish_rollout(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    eos_ids: list[int],
    tokenizer: Any,
    group_size: int,
) -> Rollout:
    """A Rollout from sampled ids (rows already G per prompt): the EOS mask, the truncation flags
    and the texts, decoded with the padding and EOS removed. Every loop ends here."""
    if completion_ids.size(1) == 0:  # every row stopped before producing a token
        completion_ids = torch.full((prompt_ids.size(0), 1), tokenizer.pad_token_id, device=prompt_ids.device)
    mask, truncated = completion_mask_from_eos(completion_ids, eos_ids)
    padded = completion_ids * mask + tokenizer.pad_token_id * (1 - mask)
    texts = tokenizer.batch_decode(padded, skip_special_tokens=True)
    return Rollout(prompt_ids, prompt_mask, completion_ids, mask, truncated, texts, group_size)


def padded(blocks: list[torch.Tensor], value: float, side: str = "right", width: int = 0) -> torch.Tensor:
    """Rows ([w] each) or blocks of rows ([n, w]) stacked into one [rows, W] tensor, each padded with
    `value` on `side` to W, the widest (at least `width`): prompts on the left, completions on the
    right, the layout every Rollout holds. The one padding helper of the rollout loops.

    >>> padded([torch.tensor([5]), torch.tensor([6, 7])], 0, "left").tolist()
    [[0, 5], [6, 7]]
    >>> padded([torch.tensor([[1, 2]]), torch.tensor([[3]])], -1, width=3).tolist()
    [[1, 2, -1], [3, -1, -1]]
    """
    rows = [block.unsqueeze(0) if block.dim() == 1 else block for block in blocks]
    wide = max([width, *(block.size(1) for block in rows)])
    room = [(wide - block.size(1), 0) if side == "left" else (0, wide - block.size(1)) for block in rows]
    return torch.cat([torch.nn.functional.pad(block, pad, value=value) for block, pad in zip(rows, room)])


def concat_rollouts(parts: list[Rollout], pad_token_id: int) -> Rollout:
    """One Rollout of several (data-parallel processes' shares, in process order): prompts stay
    left-padded and completions right-padded, to the widest part."""
    return Rollout(
        padded([r.prompt_ids for r in parts], pad_token_id, "left"),
        padded([r.prompt_mask for r in parts], 0, "left"),
        padded([r.completion_ids for r in parts], pad_token_id),
        padded([r.completion_mask for r in parts], 0),
        torch.cat([r.truncated for r in parts]),
        [text for r in parts for text in r.texts],
        parts[0].group_size,
        padded([r.engine_logps for r in parts], 0) if parts[0].engine_logps is not None else None,
        padded([r.sampled_mask for r in parts], 0) if parts[0].sampled_mask is not None else None,
        [m for r in parts for m in r.messages] if parts[0].messages is not None else None,
        _concat_columns([r.env_columns or {} for r in parts], [len(r.texts) for r in parts])
        if parts[0].env_columns is not None
        else None,
        [e for r in parts for e in r.environments] if parts[0].environments is not None else None,
        _concat_forks(parts),
    )


def _concat_forks(parts: list[Rollout]) -> list[Fork] | None:
    """Several parts' forks, each pointing at its episode's row in the whole."""
    forks, offset = [], 0
    for part in parts:
        forks += [replace(f, episode=f.episode + offset) for f in part.forks or []]
        offset += len(part.texts)
    return forks or None


def _concat_columns(parts: list[dict[str, list[Any]]], rows: list[int]) -> dict[str, list[Any]]:
    """Per-row columns of several parts, in order; a column a part lacks is None on its rows."""
    names = dict.fromkeys(name for part in parts for name in part)
    return {name: [v for part, n in zip(parts, rows) for v in part.get(name, [None] * n)] for name in names}
