"""`algo.*`: the objective: loss, clipping, KL, and the knobs of each published variant."""

from __future__ import annotations

from dataclasses import dataclass, field

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")  # algo.loss_type
ROLLOUT_CORRECTIONS = ("none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


@dataclass
class AdaptiveClipConfig:
    """`algo.adaptive_clip`: ε_t = base·(1 + alpha·(R_t − R̄)/σ_R), clamped to [min, max] (docs/architecture.md §3,
    seed 001); it replaces epsilon_low while enabled, and epsilon_high keeps its ratio to epsilon_low."""

    enabled: bool = False  # true: eps_t replaces epsilon_low; epsilon_high keeps its ratio to epsilon_low
    base: float = 0.15  # ε when the reward is at its recent mean
    alpha: float = 0.4  # sensitivity to the reward's z-score against recent batches; 0.3–0.5 advised
    window: int = 10  # previous batch means in R̄, σ_R: 9 degrees of freedom for σ, short enough to track a trend
    min: float = 0.05  # floor: below it most ratios clip and the update stalls
    max: float = 0.3  # ceiling: just above DAPO's 0.28 upper clip; looser is no trust region


@dataclass
class DynamicSamplingConfig:
    """`algo.dynamic_sampling` (DAPO §3.3, verl's filter_groups): a group whose rewards are all equal
    has zero advantage everywhere and only dilutes the batch; it is dropped and more prompts are
    drawn until the step holds train.prompts_per_step groups that carry a signal."""

    enabled: bool = False  # true: refill the step with groups that carry a signal (algo=dapo turns it on)
    max_draws: int = 4  # generation rounds per step, the first included; then the step trains on what it has (alert)


@dataclass
class RolloutCorrectionConfig:
    """`algo.rollout_correction`: importance weights pi_policy / pi_engine for a rollout engine whose
    sampling distribution differs from the policy's (rollout.backend=vllm: other kernels, other
    precision); TRL's vllm_importance_sampling_*, verl's rollout_is. The hf backend samples from the
    policy itself, so the weight is 1 and nothing is applied."""

    mode: str = "token_truncate"  # ROLLOUT_CORRECTIONS: truncate caps the weight at `cap`; mask drops tokens above it
    cap: float = 2.0  # the weight's upper bound (verl's default; TRL's is 3.0), > 1
    # the weight's lower bound, in [0, cap) (TRL's vllm_importance_sampling_clip_min): truncate raises a weight
    # below it to it, mask drops the token (sequence); 0: off (a weight is never below 0), as TRL's None
    min: float = 0.0


@dataclass
class RefSyncConfig:
    """`algo.ref_sync` (TR-DPO, TRL's sync_ref_model): a reference that trails the policy instead of
    pinning it to the start, so a long run's KL does not hold it ever harder to where it began."""

    every: int = 0  # optimizer steps between syncs; 0: off (the reference stays the starting model)
    alpha: float = 0.6  # ref <- alpha·policy + (1 − alpha)·ref at each sync (TRL's ref_model_mixup_alpha)


@dataclass
class VespoConfig:
    """`algo.vespo` (loss_type=vespo; VESPO, arXiv:2602.10693; TRL's vespo_*): each sequence's gradient
    is weighted by phi(w) = exp(lambda)·w^k·exp(-lambda·w), w its importance ratio: 1 on-policy, at its
    peak at w = k/lambda and falling off on either side, a smooth trust region instead of a hard clip;
    (k, lambda) per sign of A."""

    k_pos: float = 2.0  # where A >= 0: the power, how fast phi falls towards w = 0 (TRL's vespo_k_pos), >= 0
    lambda_pos: float = 3.0  # where A >= 0: the decay, how fast phi falls for large w (TRL's vespo_lambda_pos), > 0
    k_neg: float = 3.0  # where A < 0: the power (TRL's vespo_k_neg), >= 0
    lambda_neg: float = 2.0  # where A < 0: the decay (TRL's vespo_lambda_neg), > 0


@dataclass
class AdaptiveEntropyConfig:
    """`algo.adaptive_entropy` (Skywork-OR1, arXiv:2505.22312; TRL's use_adaptive_entropy): the entropy
    bonus's coefficient starts at algo.entropy_coef and moves by `coef_delta` each optimizer step, up while
    the step's entropy is at or below `target`, down above it, and applies only at or below the target, so
    the bonus engages when the policy collapses and stays off otherwise. Its state is in the checkpoint."""

    enabled: bool = False  # true: the coefficient follows the entropy (TRL's use_adaptive_entropy)
    coef_min: float = 0.0  # the coefficient's floor, >= 0 (TRL's entropy_coef_min)
    coef_max: float = 1.0  # the coefficient's ceiling, >= coef_min (TRL's entropy_coef_max)
    coef_delta: float = 0.005  # its move per optimizer step, >= 0 (TRL's entropy_coef_delta)
    # mean token entropy in nats of the step's kept tokens at or below which the bonus applies (TRL's
    # entropy_target); language models sit at 2-10 nats early on, so set it near the `entropy` you observe
    target: float = 0.2


@dataclass
class AlgoConfig:
    """conf/algo/grpo.yaml, the default preset."""

    loss_type: str = "grpo"  # LOSS_TYPES: how token losses are averaged; cispo, sapo, vespo: the token loss too
    scale_rewards: str = "group"  # group | batch | none
    epsilon_low: float = 0.2  # ratio clipped below at 1 - epsilon_low
    epsilon_high: float = 0.2  # ratio clipped above at 1 + epsilon_high (DAPO's clip-higher: 0.28)
    ratio_level: str = "token"  # token | sequence
    beta: float = 0.0  # 0: no reference model
    kl_estimator: str = "k3"  # k1 | k2 | k3
    num_iterations: int = 1  # optimisation passes per rollout batch (mu)
    mini_batches: int = 1  # optimizer steps per pass, each on whole groups
    mask_truncated: bool = False  # drop completions with no EOS from the loss (DAPO's overlong filter)
    kl_ratio_correction: bool = False  # k3 term times the ratio pi/pi_old (TRL: use_bias_correction_kl)
    entropy_coef: float = 0.0  # loss -= coef·entropy; 0: off (entropy is logged either way)
    delta: float = 0.0  # two-sided clipping (INTELLECT-2, TRL's delta): clip_ratio_c under TRL's name; 0: off
    sapo_temperature_pos: float = 1.0  # loss_type=sapo: the gate's temperature where A > 0
    sapo_temperature_neg: float = 1.05  # loss_type=sapo: where A <= 0 (steeper: negative updates decay faster)
    clip_ratio_c: float = 0.0  # dual-clip (verl): negative-advantage loss capped at -clip_ratio_c·A; 0: off, else > 1
    top_entropy_quantile: float = 1.0  # only tokens above this entropy quantile carry gradient (80/20 rule); 1: all
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=DynamicSamplingConfig)
    ref_sync: RefSyncConfig = field(default_factory=RefSyncConfig)
    # DeepSeek-V3.2's off-policy sequence mask (TRL's off_policy_mask_threshold): a negative-advantage sequence
    # whose mean log(pi_behaviour / pi) per token exceeds it leaves the policy term; null: off (TRL's None), else >= 0
    off_policy_mask_threshold: float | None = None
    # a mixture-of-experts model's load-balancing loss (TRL's router_aux_loss_coef): loss += coef·the router's
    # auxiliary loss; null: the coefficient the model's config declares (0 if none), 0: off, else > 0 (MoE only)
    router_aux_loss_coef: float | None = None
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    adaptive_clip: AdaptiveClipConfig = field(default_factory=AdaptiveClipConfig)
    vespo: VespoConfig = field(default_factory=VespoConfig)
    adaptive_entropy: AdaptiveEntropyConfig = field(default_factory=AdaptiveEntropyConfig)
