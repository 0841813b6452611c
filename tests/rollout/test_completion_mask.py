"""The completion mask: 1 up to and including the first EOS (docs/architecture.md §3)."""

import torch

from grpo_cli.rollout.base import completion_mask_from_eos


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
