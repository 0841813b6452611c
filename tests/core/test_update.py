"""policy_update, the function the trainer calls once per rollout batch, on a real tiny model and a
real sampled rollout: whole groups per mini-batch, exact optimizer-step counts, old log-probs
computed once, loss denominators from the loss mask, non-finite steps that change nothing, and
gradient accumulation that changes memory, not the update."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from grpo_cli.config.schema import AlgoConfig, OptimConfig
from grpo_cli.core.optim import build_optimizer
from grpo_cli.core.update import Learner, UpdateBatch, UpdateSettings, plan_mini_batches, policy_update
from tests.core.conftest import NEW, G, advantages_for, flat


def completion_logps(model, rollout) -> torch.Tensor:
    """[N, C] log-probs of the sampled completion tokens, from the model's logits over the whole sequence."""
    ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], 1)
    mask = torch.cat([rollout.prompt_mask, rollout.completion_mask], 1)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
    logps = torch.log_softmax(logits[:, -rollout.completion_ids.size(1) - 1 : -1].float(), -1)
    return logps.gather(-1, rollout.completion_ids.unsqueeze(-1)).squeeze(-1)


def run_update(
    model,
    rollout,
    advantages,
    loss_mask=None,
    algo=None,
    grad_accum=1,
    optimizer="sgd",
    reference=None,
    steps_total=100,
):
    algo = algo or AlgoConfig()
    if optimizer == "sgd":  # the update is then w - grad: gradients compare exactly
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    else:
        opt, sched = build_optimizer(model, OptimConfig(scheduler="linear", warmup_steps=0), steps_total)
    mask = rollout.completion_mask.float() if loss_mask is None else loss_mask
    torch.manual_seed(1)  # the mini-batch plan draws from the global RNG, as in training
    stats = policy_update(
        Learner(model, opt, sched, reference),
        UpdateBatch(rollout, advantages, mask),
        algo,
        UpdateSettings(1.0, NEW, grad_accum, 0.0, "padded"),
    )
    return stats, opt, sched


def test_mini_batches_hold_whole_groups_and_cover_each_group_once() -> None:
    for groups, parts in ((6, 4), (5, 2), (7, 7)):
        plan = plan_mini_batches(groups, G, parts, torch.Generator().manual_seed(3))
        assert len(plan) == parts  # exactly as many optimizer steps as asked: the LR schedule's length
        rows = torch.cat(plan).tolist()
        assert sorted(rows) == list(range(groups * G))
        for mini in plan:
            starts = {r - r % G for r in mini.tolist()}
            assert all(set(range(s, s + G)) <= set(mini.tolist()) for s in starts)


def test_optimizer_steps_are_exact_and_the_linear_schedule_ends_at_zero(base_model, rollout) -> None:
    """6 groups in 4 mini-batches: `chunk` made 3, so a linear schedule never reached its end."""
    algo = AlgoConfig(mini_batches=4, num_iterations=2)
    steps_total = 3 * algo.mini_batches * algo.num_iterations  # what the trainer plans for 3 steps
    model = copy.deepcopy(base_model)
    opt, sched = build_optimizer(model, OptimConfig(scheduler="linear", warmup_steps=0), steps_total)
    for _ in range(3):
        stats = policy_update(
            Learner(model, opt, sched),
            UpdateBatch(rollout, advantages_for(rollout), rollout.completion_mask.float()),
            algo,
            UpdateSettings(1.0, NEW, 1, 1.0, "padded"),
        )
        assert stats.optimizer_steps == 8 and stats.skipped_updates == 0
    assert sched.get_last_lr()[0] == pytest.approx(0.0, abs=1e-12)


def test_old_logprobs_are_computed_once_and_reused_across_iterations(base_model, rollout) -> None:
    model = copy.deepcopy(base_model)
    calls = []
    model.register_forward_hook(lambda module, args, out: calls.append(torch.is_grad_enabled()))
    stats, _, _ = run_update(model, rollout, advantages_for(rollout), algo=AlgoConfig(num_iterations=3))
    assert calls.count(False) == 1  # one no-grad pass for the behaviour policy's log-probs
    assert calls.count(True) == 3  # one grad pass per iteration
    # Later iterations see the moved policy against the stored old log-probs: ratios leave 1.
    assert stats.clip_frac_low + stats.clip_frac_high > 0

    single = copy.deepcopy(base_model)
    calls.clear()
    single.register_forward_hook(lambda module, args, out: calls.append(torch.is_grad_enabled()))
    run_update(single, rollout, advantages_for(rollout))
    assert calls == [True]  # one update per rollout: old = stop_gradient(lp), no extra forward


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dapo", "dr_grpo"])
def test_masked_rows_count_in_no_denominator(base_model, rollout, loss_type: str) -> None:
    """Zeroing rows of the loss mask must update exactly like a batch without those rows."""
    adv = advantages_for(rollout, seed=2)
    keep = torch.ones(rollout.completion_ids.size(0), dtype=torch.bool)
    keep[[1, 6, 13]] = False
    mask = rollout.completion_mask.float() * keep.float().unsqueeze(1)
    masked = copy.deepcopy(base_model)
    run_update(masked, rollout, adv, loss_mask=mask, algo=AlgoConfig(loss_type=loss_type))

    rows = keep.nonzero().squeeze(1)
    smaller = rollout.select(rows, group_size=int(keep.sum()))  # one "group": mini_batches=1 takes every row
    removed = copy.deepcopy(base_model)
    run_update(removed, smaller, adv[rows], algo=AlgoConfig(loss_type=loss_type))
    assert torch.allclose(flat(masked), flat(removed), atol=1e-6)


def test_a_non_finite_step_leaves_weights_and_optimizer_state_untouched(base_model, rollout) -> None:
    model = copy.deepcopy(base_model)
    before = flat(model).clone()
    adv = torch.full((rollout.completion_ids.size(0),), math.nan)
    stats, opt, sched = run_update(model, rollout, adv, optimizer="adamw")
    assert stats.skipped_updates == 1 and stats.optimizer_steps == 0
    assert torch.equal(flat(model), before)
    assert opt.state_dict()["state"] == {}  # Adam's moments were never touched
    assert sched.last_epoch == 0  # a skipped step is not a step of the schedule
    assert math.isnan(stats.grad_norm)  # no applied step: no norm to report, not an inf


def test_a_non_finite_loss_skips_the_step_even_when_its_gradient_is_finite(base_model, rollout) -> None:
    """A reference whose log-probs are near -1e38 (its last norm scaled up): k3 ≈ ref − lp per token,
    whose sum overflows to inf, while its gradient, 1 − exp(ref − lp) = 1 per token, stays finite.
    The loss decides too: an inf loss would otherwise be applied and logged."""
    reference = copy.deepcopy(base_model)
    with torch.no_grad():
        reference.model.norm.weight.mul_(1e37)
    model = copy.deepcopy(base_model)
    before = flat(model).clone()
    algo, adv = AlgoConfig(beta=1.0, loss_type="dapo"), advantages_for(rollout)
    stats, opt, _ = run_update(model, rollout, adv, algo=algo, optimizer="adamw", reference=reference)
    assert stats.kl == math.inf  # the premise: the KL, and so the loss, overflowed
    assert stats.skipped_updates == 1 and stats.optimizer_steps == 0
    assert torch.equal(flat(model), before) and opt.state_dict()["state"] == {}


def test_the_logged_kl_is_the_mean_over_the_loss_tokens_only(base_model, rollout) -> None:
    """k3 against a perturbed reference, from the two models' own logits, averaged over the loss
    mask's tokens: rows out of the loss (unscorable, or truncated and masked) are not in it."""
    reference = copy.deepcopy(base_model)
    torch.manual_seed(6)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.05 * torch.randn_like(p))
    mask = rollout.completion_mask.float()
    mask[::3] = 0
    with torch.no_grad():
        policy, ref = completion_logps(base_model, rollout), completion_logps(reference, rollout)
    k3 = torch.exp(ref - policy) - (ref - policy) - 1
    expected = ((k3 * mask).sum() / mask.sum()).item()
    everywhere = ((k3 * rollout.completion_mask).sum() / rollout.completion_mask.sum()).item()
    assert expected > 1e-3 and abs(everywhere - expected) > 1e-4  # the masked rows would change the figure
    model, adv = copy.deepcopy(base_model), advantages_for(rollout)
    stats, _, _ = run_update(model, rollout, adv, mask, AlgoConfig(beta=0.04), reference=reference)
    assert stats.kl == pytest.approx(expected, rel=1e-5)


def test_bnpo_normalises_each_micro_batch_by_its_own_loss_tokens(base_model, rollout) -> None:
    """bnpo (TRL's) is the mean over micro-batches of each one's token mean: with SGD at lr 1 and one
    update, two micro-batches move the weights by the mean of what each one's token mean (dapo's
    loss on it alone) moves them. Rows out of the loss in the first micro-batch make its token count
    differ from the second's."""
    torch.manual_seed(1)  # run_update's seed: the same mini-batch order
    first, second = plan_mini_batches(rollout.completion_ids.size(0) // G, G, 1)[0].tensor_split(2)
    mask = rollout.completion_mask.float()
    mask[first[:3]] = 0
    adv, start, algo = advantages_for(rollout, seed=4), flat(base_model), AlgoConfig(loss_type="bnpo")
    split = copy.deepcopy(base_model)
    run_update(split, rollout, adv, mask, algo, grad_accum=2)
    moves = []
    for rows in (first, second):
        alone = copy.deepcopy(base_model)
        one_batch = rollout.select(rows, group_size=rows.numel())
        run_update(alone, one_batch, adv[rows], mask[rows], AlgoConfig(loss_type="dapo"))
        moves.append(flat(alone) - start)
    assert mask[first].sum() != mask[second].sum()
    torch.testing.assert_close(flat(split) - start, (moves[0] + moves[1]) / 2, rtol=0, atol=1e-6)


def test_a_skipped_mini_batch_does_not_poison_the_logged_grad_norm(base_model, rollout) -> None:
    model = copy.deepcopy(base_model)
    adv = advantages_for(rollout)
    adv[: 3 * G] = math.nan  # the first three groups: any mini-batch holding one is non-finite
    stats, _, sched = run_update(model, rollout, adv, algo=AlgoConfig(mini_batches=6), optimizer="adamw")
    assert stats.skipped_updates == 3 and stats.optimizer_steps == 3
    assert sched.last_epoch == 3
    assert math.isfinite(stats.grad_norm) and math.isfinite(stats.loss)


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
@pytest.mark.parametrize("grad_accum", [2, 5])
def test_gradient_accumulation_changes_memory_not_the_update(base_model, rollout, loss_type, grad_accum) -> None:
    reference = copy.deepcopy(base_model)
    with torch.no_grad():  # a reference that differs, so the KL term has a gradient
        for p in reference.parameters():
            p.add_(0.01 * torch.randn_like(p))
    algo = AlgoConfig(loss_type=loss_type, beta=0.04, num_iterations=2, epsilon_high=0.28)
    adv = advantages_for(rollout, seed=5)
    whole, split = copy.deepcopy(base_model), copy.deepcopy(base_model)
    a, _, _ = run_update(whole, rollout, adv, algo=algo, reference=reference)
    b, _, _ = run_update(split, rollout, adv, algo=algo, grad_accum=grad_accum, reference=reference)
    assert torch.allclose(flat(whole), flat(split), atol=1e-5)
    assert a.loss == pytest.approx(b.loss, abs=1e-6) and a.kl == pytest.approx(b.kl, abs=1e-6)


@pytest.mark.parametrize(
    "terms",
    [{"top_entropy_quantile": 0.5}, {"entropy_coef": 0.05}, {"top_entropy_quantile": 0.5, "entropy_coef": 0.05}],
    ids=["top_entropy", "entropy_bonus", "both"],
)
@pytest.mark.parametrize(("grad_accum", "num_iterations"), [(2, 1), (5, 1), (2, 2)])
def test_gradient_accumulation_leaves_the_entropy_terms_alone(
    base_model, rollout, terms, grad_accum, num_iterations
) -> None:
    """The high-entropy tokens are the top share of the optimizer step's loss tokens and the bonus is
    the step's mean entropy over the tokens it keeps, however many micro-batches carry them (taken
    per micro-batch, q = 0.5 moved the weights differently at every grad_accum_steps)."""
    algo = AlgoConfig(loss_type="dapo", num_iterations=num_iterations, **terms)
    adv = advantages_for(rollout, seed=5)
    whole, split = copy.deepcopy(base_model), copy.deepcopy(base_model)
    a, _, _ = run_update(whole, rollout, adv, algo=algo)
    b, _, _ = run_update(split, rollout, adv, algo=algo, grad_accum=grad_accum)
    assert (flat(whole) - flat(base_model)).abs().max() > 1e-2  # the update moved the weights
    torch.testing.assert_close(flat(split), flat(whole), rtol=0, atol=1e-6 if num_iterations == 1 else 1e-5)
    assert b.loss == pytest.approx(a.loss, abs=1e-6)
    assert b.variants == pytest.approx(a.variants, abs=1e-6)  # entropy/selected: the same share kept


@pytest.mark.parametrize("num_iterations", [1, 2])
def test_logged_entropy_is_the_sampling_policys_mean_token_entropy(base_model, rollout, num_iterations) -> None:
    """With one update the loss pass measures it; with several, the behaviour pass before any move.
    Either way it is the policy that sampled, averaged over every completion token (masked ones too)."""
    model = copy.deepcopy(base_model)
    with torch.no_grad():
        ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], 1)
        mask = torch.cat([rollout.prompt_mask, rollout.completion_mask], 1)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
        c = rollout.completion_ids.size(1)
        dist = torch.distributions.Categorical(logits=logits[:, -c - 1 : -1].float())
        m = rollout.completion_mask.float()
        expected = ((dist.entropy() * m).sum() / m.sum()).item()
    half_masked = rollout.completion_mask.float()
    half_masked[::2] = 0  # the loss mask does not change which tokens the entropy covers
    stats, _, _ = run_update(
        model, rollout, advantages_for(rollout), half_masked, AlgoConfig(num_iterations=num_iterations)
    )
    assert 0 < expected < math.log(model.config.vocab_size)
    assert stats.entropy == pytest.approx(expected, rel=1e-5)
    assert stats.metrics()["entropy"] == stats.entropy


def test_the_kl_term_pulls_the_policy_back_to_the_reference(base_model, rollout) -> None:
    """With zero advantages the loss is beta·k3 alone: KL(pi || ref) must fall step after step. A
    flipped sign pushes it up; a detached KL (no gradient) leaves it where it is."""
    policy = copy.deepcopy(base_model)
    torch.manual_seed(4)
    with torch.no_grad():  # a policy that has drifted from the reference
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    algo = AlgoConfig(beta=1.0, kl_estimator="k3")
    zero = torch.zeros(rollout.completion_ids.size(0))
    opt, sched = build_optimizer(policy, OptimConfig(lr=1e-3, scheduler="constant", warmup_steps=0), 10)
    kls = []
    for _ in range(5):
        stats = policy_update(
            Learner(policy, opt, sched, base_model),
            UpdateBatch(rollout, zero, rollout.completion_mask.float()),
            algo,
            UpdateSettings(1.0, NEW, 1, 0.0, "padded"),
        )
        kls.append(stats.kl)  # measured before this call's step: KL after the previous ones
    assert kls[0] > 1e-3
    assert all(later < earlier for earlier, later in zip(kls, kls[1:])), kls
    assert kls[-1] < 0.8 * kls[0], kls


def test_later_mini_batches_take_their_ratio_against_the_behaviour_policy(base_model, rollout) -> None:
    """One iteration over 3 mini-batches: after the first step the policy has moved, so the later
    mini-batches' ratios (against the behaviour log-probs, computed once) leave 1 and clip; with
    old = stop_gradient(lp) they would stay exactly 1."""
    model = copy.deepcopy(base_model)
    calls = []
    model.register_forward_hook(lambda module, args, out: calls.append(torch.is_grad_enabled()))
    stats, _, _ = run_update(model, rollout, advantages_for(rollout), algo=AlgoConfig(mini_batches=3))
    assert calls.count(False) == 1 and calls.count(True) == 3  # one behaviour pass, one pass per mini-batch
    assert stats.optimizer_steps == 3
    assert stats.clip_frac_low + stats.clip_frac_high > 0
