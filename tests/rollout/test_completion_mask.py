"""The completion mask: 1 up to and including the first EOS (docs/architecture.md §3), and the
layout that joining rollouts keeps."""

import torch

from grpo_cli.rollout.base import Rollout, completion_mask_from_eos, concat_rollouts


def test_stops_at_first_of_several_eos_ids():
    """Any of the configured EOS ids ends the answer (e.g. </s> and <|im_end|>)."""
    ids = torch.tensor(
        [
            [5, 3, 7, 2],  # eos 3 first
            [5, 6, 2, 3],  # eos 2 first
            [5, 6, 7, 3],  # eos 3 last position
        ]
    )
    mask, truncated = completion_mask_from_eos(ids, [2, 3])
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    assert truncated.tolist() == [False, False, False]


def test_eos_at_position_zero_keeps_only_the_eos():
    """An immediately-ended answer has length 1 (the EOS itself is trained on)."""
    mask, truncated = completion_mask_from_eos(torch.tensor([[2, 5, 6, 7]]), [2])
    assert mask.tolist() == [[1, 0, 0, 0]]
    assert mask.sum(-1).tolist() == [1]
    assert truncated.tolist() == [False]


def test_no_eos_is_truncated_and_fully_kept():
    """An answer that ran out of max_new_tokens keeps every token and is flagged truncated."""
    mask, truncated = completion_mask_from_eos(torch.tensor([[5, 6, 7], [5, 2, 0]]), [2])
    assert mask.tolist() == [[1, 1, 1], [1, 1, 0]]
    assert truncated.tolist() == [True, False]


def test_repeated_eos_only_first_counts():
    """Padding with the EOS id (pad == eos) must not extend the answer."""
    mask, truncated = completion_mask_from_eos(torch.tensor([[5, 2, 2, 2], [2, 2, 2, 2]]), [2])
    assert mask.tolist() == [[1, 1, 0, 0], [1, 0, 0, 0]]
    assert truncated.tolist() == [False, False]


def test_joined_rollouts_keep_prompts_left_and_completions_right_padded():
    """Two processes' shares of different widths: each prompt still ends where its completion
    starts, and padding is masked out (the pad id 0, the engine's log-probs 0 where it padded)."""
    a = Rollout(
        torch.tensor([[7, 8]]), torch.tensor([[1, 1]]), torch.tensor([[5, 2]]), torch.tensor([[1, 1]]),
        torch.tensor([False]), ["a"], 1, torch.tensor([[-0.5, -0.25]]), torch.tensor([[1, 1]]),
    )  # fmt: skip
    b = Rollout(
        torch.tensor([[9]]), torch.tensor([[1]]), torch.tensor([[6, 6, 2]]), torch.tensor([[1, 1, 1]]),
        torch.tensor([False]), ["b"], 1, torch.tensor([[-1.0, -1.0, -1.0]]), torch.tensor([[1, 0, 1]]),
    )  # fmt: skip
    joined = concat_rollouts([a, b], pad_token_id=0)
    assert joined.prompt_ids.tolist() == [[7, 8], [0, 9]] and joined.prompt_mask.tolist() == [[1, 1], [0, 1]]
    assert joined.completion_ids.tolist() == [[5, 2, 0], [6, 6, 2]]
    assert joined.completion_mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    assert joined.sampled_mask.tolist() == [[1, 1, 0], [1, 0, 1]]
    assert joined.engine_logps.tolist() == [[-0.5, -0.25, 0.0], [-1.0, -1.0, -1.0]]
    assert joined.texts == ["a", "b"]
