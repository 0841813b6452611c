"""Our loss and gradients against TRL 1.16's, on identical tensors.

One tiny model (tests/core/conftest.py), one sampled rollout, one update. Ours is `policy_update`
with a single micro-batch, one optimizer step and num_iterations=1 (old log-probs =
logps.detach()); the optimizer keeps the gradient it is handed and moves nothing. TRL's is the real
`GRPOTrainer._compute_loss(model, inputs)` and a backward pass, on a GRPOTrainer built once on a copy
of the same weights, with the inputs its `_generate_and_score_completions` would hand over (its
reference and behaviour log-probs from its own fused LM head; the vLLM importance-sampling ratio
built as that method builds it). Each case sets the knobs where `_compute_loss` reads them:
self.loss_type, self.beta, self.args.use_bias_correction_kl, self.top_entropy_quantile,
self.entropy_coef and self._entropy_bonus_enabled (both set in __init__), self.importance_sampling_level,
self.epsilon_low and self.epsilon_high, self.args.sapo_temperature_pos and _neg, self.args.vespo_k_pos,
_lambda_pos, _k_neg and _lambda_neg, self.off_policy_mask_threshold, self.use_vllm and
self.vllm_importance_sampling_correction (with self.vllm_importance_sampling_mode, ..._clip_max and
..._clip_min for the ratio), self.use_adaptive_entropy with self.args.entropy_coef_min, _max, _delta and
self.args.entropy_target (and the controller's state, self.entropy_coef and self._last_world_entropy,
which the adaptive cases set on both sides and compare after the step: the coefficient moved and the
entropy it measured). Each case's loss or gradient must also differ from TRL's without the case's knob,
by ten times the tolerance: no case passes because its term vanished.

The rollout's completions end at drawn lengths (the random model almost never samples EOS, and at
equal lengths the four loss types coincide); its prompts differ in length (left padding). On-policy
the clip is inactive (ratio 1) and a sequence-level ratio has the token-level gradient unless a term
weighs tokens apart, so the sequence case runs with the ratio-corrected KL; CISPO's, SAPO's and
VESPO's gradients are then dapo's and grpo's (VESPO's weight is 1 at ratio 1), their loss values are
not: VESPO's parameters act on-policy only through the rollout correction's weights, which enter its
sequence weight. LUSPO sums each sequence's tokens, so its gradient is grpo's reweighted by length.
The off-policy mask reads the sampler's log-probs, the engine's where the rollout has them
(inputs["sampling_per_token_logps"], as TRL's vLLM path hands them over). With one micro-batch bnpo
and dapo divide by the same count.

Off-policy (test_off_policy_loss_and_gradients_equal_trls): the same comparison with old log-probs
= the policy's + a fixed perturbation, handed to TRL as inputs["old_per_token_logps"] and to ours as
the stored behaviour log-probs of `micro_step` (what policy_update hands it when the policy moves
between updates), with `step_normalizer`'s denominators: the importance ratio is far from 1, so
PPO's clip on both sides, two-sided clipping (delta), CISPO's cap, SAPO's gate away from 1, the
sequence-level (GSPO, LUSPO) clip, VESPO's weight away from 1, the off-policy mask (the rollout without
engine log-probs: the drift from old) and the ratio-weighted KL act. Each case asserts its clip or cap
changes the objective on some tokens (sequences) and not on all, and that each of its knobs changes
TRL's gradient.

Left out:
- dual-clip (algo.clip_ratio_c) and the k1/k2 KL estimators: TRL has no such knob.
- adaptive entropy over several optimizer steps, and a step with no kept token (TRL counts its
  entropy 0, ours leaves the controller alone): one _compute_loss is one step here;
  tests/core/test_entropy.py runs the controller across steps and through a checkpoint.
- two-sided clipping (algo.delta, TRL's delta) on-policy: a cap above 1 on a ratio that is 1
  on-policy, so the case could not fail (the off-policy cases have it).
- rows with no loss token: grpo's, dr_grpo's and luspo's denominators count only rows in the loss (ours),
  every row (TRL); every row here has tokens (tests/core/test_update.py covers ours).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import math
import random

import numpy as np
import pytest
import torch

trl = pytest.importorskip("trl", reason="pip install 'grpo-cli[bench]'")

from grpo_cli.config.schema import (  # noqa: E402
    AdaptiveEntropyConfig,
    AlgoConfig,
    RolloutConfig,
    RolloutCorrectionConfig,
    VespoConfig,
)
from grpo_cli.core.entropy import AdaptiveEntropy  # noqa: E402
from grpo_cli.core.logprobs import completion_logprobs_and_entropy  # noqa: E402
from grpo_cli.core.parallel import SingleProcess  # noqa: E402
from grpo_cli.core.update import (  # noqa: E402
    Learner,
    Objective,
    UpdateBatch,
    UpdateSettings,
    logprobs_without_grad,
    micro_step,
    policy_update,
    step_normalizer,
)
from grpo_cli.models import load_tokenizer  # noqa: E402
from grpo_cli.rollout import HFGenerator, Rollout  # noqa: E402
from grpo_cli.rollout.base import finish_rollout  # noqa: E402
from grpo_cli.rollout.prompts import PromptEncoder  # noqa: E402
from tests.core.conftest import NEW, G  # noqa: E402

TOL = 1e-5
TEMPERATURE = 0.7  # both divide the logits by it: the sampling distribution's log-probs
EPSILONS = (0.2, 0.28)
BETA = 0.04
CAP = 1.5  # the rollout correction's cap: TRL's vllm_importance_sampling_clip_max
FLOOR = 0.5  # its lower bound, where a case sets one: TRL's vllm_importance_sampling_clip_min
OFF_POLICY_THRESHOLD = 0.1  # the off-policy mask's, on-policy (the engine's drift): some sequences dropped, not all
PROMPTS = ["1+2=", "12+3=", "4+56=", "123+4=", "7+8=", "90+12="]  # different lengths: left padding
ROWS = len(PROMPTS) * G


@dataclasses.dataclass(frozen=True)
class Case:
    loss_type: str = "grpo"
    epsilon_high: float = EPSILONS[1]
    beta: float = 0.0
    kl_ratio_correction: bool = False  # TRL: use_bias_correction_kl
    top_entropy_quantile: float = 1.0
    entropy_coef: float = 0.0
    rollout_correction: str = "none"  # TRL: use_vllm and vllm_importance_sampling_mode
    ratio_level: str = "token"  # TRL: importance_sampling_level
    without: tuple[tuple[str, object], ...] = ()  # the knob off: TRL's gradient must differ
    epsilon_low: float = EPSILONS[0]
    delta: float = 0.0  # TRL: args.delta (None for 0)
    rollout_min: float = 0.0  # TRL: vllm_importance_sampling_clip_min (None for 0)
    off_policy_mask_threshold: float | None = None  # TRL: off_policy_mask_threshold
    vespo: VespoConfig = dataclasses.field(default_factory=VespoConfig)  # TRL: args.vespo_*
    adaptive_entropy: AdaptiveEntropyConfig = dataclasses.field(default_factory=AdaptiveEntropyConfig)
    entropy_state: tuple[float, float] | None = None  # (coefficient, last entropy) both start from; None: fresh

    def algo(self) -> AlgoConfig:
        return AlgoConfig(
            loss_type=self.loss_type,
            epsilon_low=self.epsilon_low,
            epsilon_high=self.epsilon_high,
            ratio_level=self.ratio_level,
            beta=self.beta,
            kl_estimator="k3",
            kl_ratio_correction=self.kl_ratio_correction,
            entropy_coef=self.entropy_coef,
            top_entropy_quantile=self.top_entropy_quantile,
            delta=self.delta,
            rollout_correction=RolloutCorrectionConfig(mode=self.rollout_correction, cap=CAP, min=self.rollout_min),
            off_policy_mask_threshold=self.off_policy_mask_threshold,
            vespo=self.vespo,
            adaptive_entropy=self.adaptive_entropy,
        )


KL = {"beta": BETA}
ADAPTIVE = AdaptiveEntropyConfig(enabled=True)  # TRL's defaults: target 0.2 nats, far below the tiny model's
APPLIED = AdaptiveEntropyConfig(enabled=True, coef_delta=0.02, target=100.0)  # at or below the target: applied
MOVED = (0.05, 3.0)  # a coefficient moved from entropy_coef, and a last entropy at or below APPLIED's target
CASES = {
    "grpo": Case(),
    "bnpo": Case("bnpo", without=(("loss_type", "grpo"),)),
    "dr_grpo": Case("dr_grpo", without=(("loss_type", "grpo"),)),
    "dapo": Case("dapo", without=(("loss_type", "grpo"),)),
    "cispo": Case("cispo", epsilon_high=5.0, without=(("loss_type", "dapo"),)),
    "sapo": Case("sapo", without=(("loss_type", "grpo"),)),
    "kl": Case(**KL, without=(("beta", 0.0),)),
    "kl_ratio_corrected": Case(**KL, kl_ratio_correction=True, without=(("kl_ratio_correction", False),)),
    "top_entropy": Case(top_entropy_quantile=0.2, without=(("top_entropy_quantile", 1.0),)),
    "entropy_bonus": Case(entropy_coef=0.01, without=(("entropy_coef", 0.0),)),
    "entropy_bonus_top_entropy": Case(top_entropy_quantile=0.2, entropy_coef=0.01, without=(("entropy_coef", 0.0),)),
    **{
        f"rollout_{mode}": Case(rollout_correction=mode, without=(("rollout_correction", "none"),))
        for mode in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
    },
    "sequence_ratio": Case(**KL, kl_ratio_correction=True, ratio_level="sequence", without=(("ratio_level", "token"),)),
    "luspo": Case("luspo", ratio_level="sequence", without=(("loss_type", "grpo"),)),
    "vespo": Case("vespo", without=(("loss_type", "dapo"),)),
    **{
        f"vespo_rollout_{mode}": Case("vespo", rollout_correction=mode, without=(("rollout_correction", "none"),))
        for mode in ("token_truncate", "token_mask")
    },
    "vespo_parameters": Case(
        "vespo",
        rollout_correction="token_truncate",
        vespo=VespoConfig(1.0, 1.5, 4.0, 3.0),
        without=(("vespo", VespoConfig()),),
    ),
    **{
        f"rollout_{mode}_min": Case(rollout_correction=mode, rollout_min=FLOOR, without=(("rollout_min", 0.0),))
        for mode in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
    },
    "off_policy_mask": Case(
        off_policy_mask_threshold=OFF_POLICY_THRESHOLD, without=(("off_policy_mask_threshold", None),)
    ),
    # fresh: no entropy measured yet, so no bonus, where the static coefficient applies
    "adaptive_entropy": Case(
        entropy_coef=0.01, adaptive_entropy=ADAPTIVE, without=(("adaptive_entropy", AdaptiveEntropyConfig()),)
    ),
    # moved and applied: the moved coefficient, where the static one is entropy_coef
    "adaptive_entropy_applied": Case(
        entropy_coef=0.01,
        adaptive_entropy=APPLIED,
        entropy_state=MOVED,
        without=(("adaptive_entropy", AdaptiveEntropyConfig()),),
    ),
    "adaptive_entropy_top_entropy": Case(
        "dapo",
        top_entropy_quantile=0.2,
        entropy_coef=0.01,
        adaptive_entropy=APPLIED,
        entropy_state=MOVED,
        without=(("adaptive_entropy", AdaptiveEntropyConfig()),),
    ),
    "every_term": Case(
        "dapo",
        **KL,
        kl_ratio_correction=True,
        top_entropy_quantile=0.2,
        entropy_coef=0.01,
        rollout_correction="token_truncate",
        without=(("rollout_correction", "none"), ("entropy_coef", 0.0), ("top_entropy_quantile", 1.0)),
    ),
}


class KeepGradient(torch.optim.Optimizer):
    """An optimizer whose step keeps the gradient it is handed and moves nothing."""

    def __init__(self, params) -> None:
        super().__init__(params, {"lr": 0.0})  # the scheduler reads an lr
        self.grads: dict[int, torch.Tensor] = {}

    @torch.no_grad()
    def step(self, closure=None) -> None:
        self.grads = {id(p): p.grad.clone() for group in self.param_groups for p in group["params"]}


@pytest.fixture(scope="module")
def batch(base_model, tiny_model_dir) -> Rollout:
    """A sampled rollout whose completions end at drawn lengths (a few truncated), with engine
    log-probs = the policy's + a fixed perturbation (weights pi_policy / pi_engine across the cap),
    one of them NaN (an engine figure missing)."""
    tokenizer = load_tokenizer(tiny_model_dir)
    ids, mask = PromptEncoder(tokenizer, 64, torch.device("cpu"))(PROMPTS)
    assert not mask.all()  # left padding
    generator = HFGenerator(base_model, tokenizer, RolloutConfig(max_new_tokens=NEW, temperature=TEMPERATURE))
    with torch.random.fork_rng():
        torch.manual_seed(0)
        sampled = generator.generate(ids, mask, G)
    draw = torch.Generator().manual_seed(0)
    completion_ids = sampled.completion_ids.clone()
    ends = torch.randint(0, NEW + 2, (ROWS,), generator=draw)  # NEW or more: no EOS, truncated
    for row, end in enumerate(ends.tolist()):
        if end < NEW:
            completion_ids[row, end] = generator.eos_ids[0]
    rollout = finish_rollout(sampled.prompt_ids, sampled.prompt_mask, completion_ids, generator.eos_ids, tokenizer, G)
    lengths = rollout.completion_mask.sum(-1)
    assert lengths.min() >= 1 and len(set(lengths.tolist())) > 3 and rollout.truncated.any()
    with torch.no_grad():
        policy, _ = completion_logprobs_and_entropy(
            base_model, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids, rollout.completion_mask,
            TEMPERATURE, with_entropy=False,
        )  # fmt: skip
    engine = policy + 0.5 * torch.randn(policy.shape, generator=draw)
    engine[0, 0] = math.nan
    return dataclasses.replace(rollout, engine_logps=engine)


@pytest.fixture(scope="module")
def reference(base_model):
    """A reference away from the policy, so the KL term and its ratio correction weigh."""
    ref = copy.deepcopy(base_model)
    with torch.no_grad():
        draw = torch.Generator().manual_seed(7)
        for p in ref.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=draw))
    return ref


@pytest.fixture(scope="module")
def trainer(base_model, reference, tiny_model_dir, tmp_path_factory):
    """TRL's GRPOTrainer on a copy of the policy, built once: beta > 0 so it builds its reference
    (from the tiny directory), which then takes our reference's weights. TRL's __init__ seeds every
    RNG: the test session's are put back."""
    from datasets import Dataset  # a dependency of TRL's

    names = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    checkpointing = "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"
    config = trl.GRPOConfig(
        output_dir=str(tmp_path_factory.mktemp("trl")),
        per_device_train_batch_size=ROWS,
        gradient_accumulation_steps=1,
        num_generations=G,
        max_completion_length=NEW,
        temperature=TEMPERATURE,
        beta=BETA,
        epsilon=EPSILONS[0],
        epsilon_high=EPSILONS[1],
        vllm_importance_sampling_clip_max=CAP,
        bf16=False,
        use_cpu=True,
        report_to="none",
        logging_strategy="no",
        save_strategy="no",
        disable_tqdm=True,
        **{checkpointing: False},
    )
    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    try:
        trl_trainer = trl.GRPOTrainer(
            model=copy.deepcopy(base_model),
            reward_funcs=[lambda prompts, completions, **kwargs: [0.0] * len(completions)],
            args=config,
            train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS]),
            processing_class=load_tokenizer(tiny_model_dir),
        )
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
    trl_trainer.ref_model.load_state_dict(reference.state_dict())
    trl_trainer.current_gradient_accumulation_steps = 1  # what Trainer's loop sets: micro-batches per step
    assert trl_trainer.args.steps_per_generation == 1 and trl_trainer.model.training
    yield trl_trainer
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)  # as accelerate's own test cases tear down
    GradientState._reset_state()


def ours(base_model, reference, batch: Rollout, advantages: torch.Tensor, case: Case):
    """(loss, gradients, the adaptive entropy controller after the step)."""
    model = copy.deepcopy(base_model)
    optimizer = KeepGradient(model.parameters())
    algo = case.algo()
    control = AdaptiveEntropy(algo.adaptive_entropy, algo.entropy_coef)
    if case.entropy_state is not None and control.enabled:
        control.load_state_dict({"coef": case.entropy_state[0], "last_entropy": case.entropy_state[1]})
    stats = policy_update(
        Learner(
            model,
            optimizer,
            torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0),
            reference if case.beta > 0 else None,
        ),
        UpdateBatch(batch, advantages, batch.completion_mask.float()),
        algo,
        UpdateSettings(TEMPERATURE, NEW, 1, 0.0, "padded"),
        entropy_control=control,
    )
    assert stats.optimizer_steps == 1
    return stats.loss, {name: optimizer.grads[id(p)] for name, p in model.named_parameters()}, control


def trl_importance_sampling_ratio(trainer, old_logps, sampling_logps, mask) -> torch.Tensor:
    """vllm_importance_sampling_ratio as TRL's _generate_and_score_completions builds it."""
    diff = torch.nan_to_num((old_logps - sampling_logps) * mask, nan=0.0)
    if trainer.vllm_importance_sampling_mode in ["sequence_mask", "sequence_truncate"]:
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    low, high = trainer.vllm_importance_sampling_clip_min, trainer.vllm_importance_sampling_clip_max
    if trainer.vllm_importance_sampling_mode in ["sequence_truncate", "token_truncate"]:
        return torch.clamp(ratio, min=low, max=high)
    low = low if low is not None else -math.inf
    high = high if high is not None else math.inf
    return ratio.masked_fill((ratio < low) | (ratio > high), value=0.0)


def test_the_importance_sampling_ratio_is_built_as_trls_source_builds_it() -> None:
    """trl_importance_sampling_ratio copies a block of TRL's; a TRL that changed it fails here."""
    source = inspect.getsource(trl.GRPOTrainer._generate_and_score_completions)
    for line in (
        "per_token_logps_diff = (old_per_token_logps - sampling_per_token_logps) * mask",
        "per_token_logps_diff = torch.nan_to_num(per_token_logps_diff, nan=0.0)",
        'sequence_level_is = self.vllm_importance_sampling_mode in ["sequence_mask", "sequence_truncate"]',
        "per_sequence_logps_diff = per_token_logps_diff.sum(dim=-1, keepdim=True)",
        "vllm_importance_sampling_ratio = torch.exp(logps_diff)",
        'if self.vllm_importance_sampling_mode in ["sequence_truncate", "token_truncate"]:',
        "min=self.vllm_importance_sampling_clip_min,",
        "max=self.vllm_importance_sampling_clip_max,",
        "invalid_mis_mask, value=0.0",
    ):
        assert line in source, line


def test_the_off_policy_mask_reads_the_samplers_log_probs_as_trls_source_does() -> None:
    """trls hands TRL the engine's log-probs as inputs["sampling_per_token_logps"], which its
    _generate_and_score_completions builds from vLLM's and its off-policy mask prefers to old."""
    assert 'inputs.get("sampling_per_token_logps", old_per_token_logps)' in inspect.getsource(
        trl.GRPOTrainer._compute_loss
    )
    assert 'output["sampling_per_token_logps"] = sampling_per_token_logps' in inspect.getsource(
        trl.GRPOTrainer._generate_and_score_completions
    )


def configure(trainer, case: Case) -> None:
    """Every knob, every case (the trainer is shared), where _compute_loss reads it."""
    algo = case.algo()
    trainer.loss_type = case.loss_type
    trainer.epsilon_low, trainer.epsilon_high = algo.epsilon_low, algo.epsilon_high
    trainer.args.sapo_temperature_pos = algo.sapo_temperature_pos
    trainer.args.sapo_temperature_neg = algo.sapo_temperature_neg
    trainer.beta = case.beta
    trainer.args.use_bias_correction_kl = case.kl_ratio_correction
    trainer.top_entropy_quantile = case.top_entropy_quantile
    adaptive = algo.adaptive_entropy
    trainer.use_adaptive_entropy = adaptive.enabled
    trainer.args.entropy_coef_min, trainer.args.entropy_coef_max = adaptive.coef_min, adaptive.coef_max
    trainer.args.entropy_coef_delta, trainer.args.entropy_target = adaptive.coef_delta, adaptive.target
    state = case.entropy_state if adaptive.enabled else None  # a state only the controller has
    trainer.entropy_coef, trainer._last_world_entropy = state or (case.entropy_coef, math.inf)
    trainer._entropy_window_stats = None
    trainer._entropy_bonus_enabled = case.entropy_coef != 0.0 or adaptive.enabled  # __init__'s
    trainer.importance_sampling_level = case.ratio_level
    trainer.args.delta = algo.delta if algo.delta > 0 else None
    trainer.off_policy_mask_threshold = case.off_policy_mask_threshold
    for name in ("k_pos", "lambda_pos", "k_neg", "lambda_neg"):
        setattr(trainer.args, f"vespo_{name}", getattr(algo.vespo, name))
    trainer.use_vllm = trainer.vllm_importance_sampling_correction = case.rollout_correction != "none"
    trainer.vllm_importance_sampling_clip_min = case.rollout_min or None
    if trainer.use_vllm:
        trainer.vllm_importance_sampling_mode = case.rollout_correction
    assert trainer.accelerator.sync_gradients  # the adaptive controller moves at an optimizer step's end


def trls(trainer, batch: Rollout, advantages: torch.Tensor, case: Case, old: torch.Tensor | None = None):
    """TRL's loss and gradients; `old`: its inputs["old_per_token_logps"] (None: on-policy, or the
    policy's own with the vLLM correction, as _generate_and_score_completions computes them)."""
    configure(trainer, case)
    model = trainer.model
    ids = torch.cat([batch.prompt_ids, batch.completion_ids], dim=1)
    attention = torch.cat([batch.prompt_mask, batch.completion_mask], dim=1)
    inputs = {
        "prompt_ids": batch.prompt_ids,
        "prompt_mask": batch.prompt_mask,
        "completion_ids": batch.completion_ids,
        "completion_mask": batch.completion_mask,
        "advantages": advantages,
        "num_items_in_batch": batch.completion_mask.sum(),  # _generate_and_score_completions's, one process
    }
    width = batch.completion_ids.size(1)
    if old is not None:
        inputs["old_per_token_logps"] = old
    if batch.engine_logps is not None and case.off_policy_mask_threshold is not None:
        inputs["sampling_per_token_logps"] = batch.engine_logps  # what the vLLM path hands over
    with torch.no_grad():
        if trainer.use_vllm and trainer.vllm_importance_sampling_correction:
            assert old is None
            old, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, attention, width, batch_size=ROWS)
            inputs["old_per_token_logps"] = old
            inputs["importance_sampling_ratio"] = trl_importance_sampling_ratio(
                trainer, old, batch.engine_logps, batch.completion_mask
            )
        if trainer.beta != 0.0:
            inputs["ref_per_token_logps"], _, _ = trainer._get_per_token_logps_and_entropies(
                trainer.ref_model, ids, attention, width, batch_size=ROWS
            )
    model.zero_grad(set_to_none=True)
    loss = trainer._compute_loss(model, inputs)
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return loss.item(), grads, inputs.get("importance_sampling_ratio")


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[name] - b[name]).abs().max().item() for name in a)


@pytest.mark.parametrize("name", list(CASES))
def test_loss_and_gradients_equal_trls(name, base_model, reference, batch, trainer) -> None:
    case = CASES[name]
    advantages = torch.randn(ROWS, generator=torch.Generator().manual_seed(3))
    loss, grads, control = ours(base_model, reference, batch, advantages, case)
    trl_loss, trl_grads, ratio = trls(trainer, batch, advantages, case)
    grad_difference = max_difference(grads, trl_grads)
    print(f"{name}: loss {loss:.6f}, TRL's {trl_loss:.6f} (difference {abs(loss - trl_loss):.1e}), ", end="")
    print(f"max |gradient difference| {grad_difference:.1e}")
    assert loss == pytest.approx(trl_loss, abs=TOL)
    assert grad_difference <= TOL
    if control.enabled:  # the controller moved as TRL's did: the coefficient and the entropy it measured
        moved = (control.coef, control.last_entropy)
        print(f"  adaptive entropy: coefficient {moved[0]:.4f} (TRL's {trainer.entropy_coef:.4f}), ", end="")
        print(f"entropy {moved[1]:.6f} (TRL's {trainer._last_world_entropy:.6f})")
        assert moved == pytest.approx((trainer.entropy_coef, trainer._last_world_entropy), abs=TOL)
        start = case.entropy_state[0] if case.entropy_state else case.entropy_coef
        assert moved[0] != pytest.approx(start)
    if case.without:  # the knob changes TRL's figures: the comparison is not of a vanished term
        without_loss, without, _ = trls(trainer, batch, advantages, dataclasses.replace(case, **dict(case.without)))
        loss_effect, grad_effect = abs(trl_loss - without_loss), max_difference(trl_grads, without)
    else:
        loss_effect, grad_effect = abs(trl_loss), max(g.abs().max().item() for g in grads.values())
    print(f"  the knob's effect on TRL's loss {loss_effect:.1e}, on its gradient {grad_effect:.1e}")
    if case.loss_type in ("cispo", "sapo", "vespo") and "loss_type" in dict(case.without):
        assert loss_effect > 10 * TOL  # on-policy, dapo's and grpo's gradient: the value differs
    else:
        assert grad_effect > 10 * TOL
    if ratio is not None:  # each bound bites on some tokens (sequences), not on all
        truncate = case.rollout_correction.endswith("truncate")
        bounds = [ratio == CAP] + ([ratio == FLOOR] if case.rollout_min else []) if truncate else [ratio == 0]
        for capped in bounds:
            rows = capped.any(-1) if ratio.size(-1) == 1 else capped[batch.completion_mask.bool()]
            assert 0 < rows.float().mean() < 1


# Off-policy: old log-probs = the policy's + PERTURBATION * U(-1, 1) per token, so ratios exp(-perturbation)
# run from 0.08 to 12: below 1 - eps_low, inside the clip range, above 1 + eps_high, above CISPO's cap of 5.
PERTURBATION = 2.5
GSPO_EPSILONS = (3e-4, 4e-4)  # the GSPO paper's: a sequence-level ratio strays little from 1
LUSPO_EPSILONS = (2e-3, 2.5e-3)  # the LUSPO paper's (§5.1)
OFF_POLICY = {
    "grpo": Case(without=(("epsilon_low", 1.0), ("epsilon_high", math.inf))),
    "dapo": Case("dapo", without=(("loss_type", "grpo"), ("epsilon_high", EPSILONS[0]))),
    "delta": Case(delta=1.5, without=(("delta", 0.0),)),
    "cispo": Case("cispo", epsilon_high=5.0, without=(("epsilon_high", math.inf),)),
    "sapo": Case("sapo", without=(("loss_type", "grpo"),)),
    "sequence_ratio": Case(
        "grpo",
        GSPO_EPSILONS[1],
        epsilon_low=GSPO_EPSILONS[0],
        ratio_level="sequence",
        without=(("ratio_level", "token"), ("epsilon_low", 1.0), ("epsilon_high", math.inf)),
    ),
    "kl_ratio_corrected": Case(**KL, kl_ratio_correction=True, without=(("kl_ratio_correction", False),)),
    "luspo": Case(
        "luspo",
        LUSPO_EPSILONS[1],
        epsilon_low=LUSPO_EPSILONS[0],
        ratio_level="sequence",
        without=(("loss_type", "grpo"), ("epsilon_low", 1.0), ("epsilon_high", math.inf)),
    ),
    "vespo": Case(
        "vespo",
        without=(
            ("loss_type", "dapo"),
            ("vespo", VespoConfig(k_pos=1.0)),
            ("vespo", VespoConfig(lambda_pos=1.0)),
            ("vespo", VespoConfig(k_neg=1.0)),
            ("vespo", VespoConfig(lambda_neg=1.0)),
        ),
    ),
    "off_policy_mask": Case(off_policy_mask_threshold=0.2, without=(("off_policy_mask_threshold", None),)),
}


@pytest.fixture(scope="module")
def off_policy(base_model, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(policy log-probs, old log-probs = those + a fixed perturbation), [N, C] each."""
    with torch.no_grad():
        policy, _ = completion_logprobs_and_entropy(
            base_model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask,
            TEMPERATURE, with_entropy=False,
        )  # fmt: skip
    draw = torch.Generator().manual_seed(11)
    return policy, policy + PERTURBATION * (2 * torch.rand(policy.shape, generator=draw) - 1)


def ours_off_policy(base_model, reference, batch: Rollout, advantages, old: torch.Tensor, case: Case):
    """micro_step on every row with stored behaviour log-probs `old`, as policy_update runs it when
    the policy moves between updates: the step's denominators from step_normalizer, the
    reference's log-probs from logprobs_without_grad. Returns (loss, gradients, clip sums)."""
    model = copy.deepcopy(base_model)
    optimizer = KeepGradient(model.parameters())
    learner = Learner(
        model,
        optimizer,
        torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0),
        reference if case.beta > 0 else None,
    )
    algo, settings = case.algo(), UpdateSettings(TEMPERATURE, NEW, 1, 0.0, "padded")
    update = UpdateBatch(batch, advantages, batch.completion_mask.float())
    refs = logprobs_without_grad(reference, batch, ROWS, settings, contextlib.nullcontext) if case.beta > 0 else None
    objective = Objective(algo, (algo.epsilon_low, algo.epsilon_high), settings, old, refs)
    assert objective.reuse_old
    rows = torch.arange(ROWS)
    normalizer, micro_tokens = step_normalizer(update.loss_mask, rows, (rows,), algo.loss_type, NEW, SingleProcess())
    sums = micro_step(learner, update, objective, rows, normalizer, micro_tokens[0])
    return sums.loss, {name: p.grad.clone() for name, p in model.named_parameters()}, sums


def acted(case: Case, log_ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """The share of loss tokens (sequences, at the sequence level) where each of the case's clips
    or caps changes the objective, from log pi/pi_old; for SAPO, where the ratio leaves PPO's clip
    range (the gate is then far from linear)."""
    adv = advantages.unsqueeze(-1).expand_as(log_ratio)
    if case.ratio_level == "sequence":  # every row here has loss tokens
        log_ratio = (log_ratio * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True)
        adv, mask = advantages.unsqueeze(-1), torch.ones_like(log_ratio)
    algo, ratio, selected = case.algo(), log_ratio.exp(), mask.bool()
    if case.loss_type == "cispo":
        events = {"capped": ratio > algo.epsilon_high}
    elif case.loss_type == "sapo":
        events = {
            "outside [1 - eps_low, 1 + eps_high]": (ratio < 1 - algo.epsilon_low) | (ratio > 1 + algo.epsilon_high)
        }
    elif case.loss_type == "vespo":  # its weight: 1 at a sequence ratio of 1, far from it outside [1/2, 2]
        events = {"sequence ratio outside [1/2, 2]": ((log_ratio * mask).sum(-1, keepdim=True).abs() > math.log(2))}
    else:
        events = {
            "clipped low": (ratio < 1 - algo.epsilon_low) & (adv < 0),
            "clipped high": (ratio > 1 + algo.epsilon_high) & (adv > 0),
        }
        if algo.delta > 0:
            events["capped at delta"] = (ratio > algo.delta) & (adv < 0)
    if algo.off_policy_mask_threshold is not None:  # the mean drift log pi_old/pi of a negative sequence
        drift = (-log_ratio * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True)
        events["masked off-policy"] = (adv < 0) & (drift > algo.off_policy_mask_threshold)
    return {name: event.expand_as(selected)[selected].float().mean().item() for name, event in events.items()}


@pytest.mark.parametrize("name", list(OFF_POLICY))
def test_off_policy_loss_and_gradients_equal_trls(name, base_model, reference, batch, trainer, off_policy) -> None:
    case = OFF_POLICY[name]
    policy, old = off_policy
    if case.off_policy_mask_threshold is not None:  # without engine log-probs the mask reads old's drift
        batch = dataclasses.replace(batch, engine_logps=None)
    advantages = torch.randn(ROWS, generator=torch.Generator().manual_seed(3))
    loss, grads, sums = ours_off_policy(base_model, reference, batch, advantages, old, case)
    trl_loss, trl_grads, _ = trls(trainer, batch, advantages, case, old)
    grad_difference = max_difference(grads, trl_grads)
    shares = acted(case, policy - old, advantages, batch.completion_mask)
    print(f"off-policy {name}: loss {loss:.6f}, TRL's {trl_loss:.6f} (difference {abs(loss - trl_loss):.1e}), ", end="")
    print(f"max |gradient difference| {grad_difference:.1e}; " + ", ".join(f"{k} {v:.0%}" for k, v in shares.items()))
    assert loss == pytest.approx(trl_loss, abs=TOL)
    assert grad_difference <= TOL
    for event, share in shares.items():  # each clip or cap acts on some tokens (sequences), not on all
        assert 0 < share < 1, event
    if case.loss_type not in ("cispo", "sapo", "vespo") and case.ratio_level == "token":  # ours counts as the test does
        tokens = batch.completion_mask.sum().item()
        assert (sums.clip_low / tokens, sums.clip_high / tokens) == pytest.approx(
            (shares["clipped low"], shares["clipped high"])
        )
    for knob, off in case.without:  # each knob, alone, changes TRL's gradient on these tensors
        _, without, _ = trls(trainer, batch, advantages, dataclasses.replace(case, **{knob: off}), old)
        effect = max_difference(trl_grads, without)
        print(f"  {knob}={off}'s effect on TRL's gradient {effect:.1e}")
        assert effect > 10 * TOL, knob
