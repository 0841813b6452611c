"""RewardCurriculum with worked numbers: the shipped schedules as `grpo train` composes them, the
exact `linear` blend, user phases from the command line, and the start-up errors a user sees."""

from __future__ import annotations

import copy
import dataclasses
import io
import logging

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from rich.console import Console

from grpo_cli.commands.entry import register_schemas
from grpo_cli.config.schema import CurriculumConfig, CurriculumPhase, RewardFunctionConfig, TrainConfig
from grpo_cli.config.train_checks import validate
from grpo_cli.errors import GrpoError
from grpo_cli.rewards import RewardFusion, RewardSource
from grpo_cli.rewards.builtin import exact_match
from grpo_cli.training.curriculum import THREE_PHASE, RewardCurriculum

USER_PHASES = "curriculum.phases=[{until:0.5,weights:{exact_match:2.0}},{until:1.0,weights:{exact_match:1.0}}]"


def composed(*overrides: str) -> TrainConfig:
    """The config `grpo train OVERRIDES...` runs, as the schema's dataclasses."""
    register_schemas()
    with initialize_config_module("grpo_cli.conf", version_base=None):
        cfg = compose(config_name="train", overrides=list(overrides))
    obj = OmegaConf.to_object(cfg)
    assert isinstance(obj, TrainConfig)
    return obj


def curriculum_of(cfg: TrainConfig, steps: int | None = None) -> RewardCurriculum:
    return RewardCurriculum(cfg.curriculum, cfg.reward.functions, steps or cfg.train.steps)


def column(curriculum: RewardCurriculum, name: str, steps: int) -> list[float]:
    return [curriculum.weights(s)[name] for s in range(steps)]


@pytest.fixture(scope="module")
def composed_three_phase() -> TrainConfig:
    return composed("reward=code", "curriculum=three_phase")


@pytest.fixture
def code_three_phase(composed_three_phase: TrainConfig) -> TrainConfig:
    """A copy per test (composing is slow, once per module): the linear tests set interpolate on theirs."""
    return copy.deepcopy(composed_three_phase)


# ---- constant ----------------------------------------------------------------------------------
def test_constant_default_gives_the_configured_weights_at_every_step() -> None:
    cfg = TrainConfig()
    cfg.reward.functions[1].weight = 0.5
    curriculum = curriculum_of(cfg)
    assert all(curriculum.weights(s) == {"exact_match": 1.0, "partial_credit": 0.5} for s in (0, 150, 299, 400))


def test_functions_a_phase_leaves_out_keep_their_weight_and_the_fusion_takes_the_result() -> None:
    functions = [RewardFunctionConfig(name="a", weight=0.5), RewardFunctionConfig(name="b", weight=2.0, fallback="a")]
    cfg = CurriculumConfig(name="phased", phases=[CurriculumPhase(0.5, {"a": 3.0}), CurriculumPhase(1.0, {"b": 0.0})])
    curriculum = RewardCurriculum(cfg, functions, total_steps=4)
    assert [curriculum.weights(s) for s in range(4)] == [{"a": 3.0, "b": 2.0}] * 2 + [{"a": 0.5, "b": 0.0}] * 2
    fusion = RewardFusion([RewardSource(f.name, exact_match, f.weight, fallback=f.fallback) for f in functions])
    fusion.masked.append("b")  # as after b's failures: its curriculum weight moves to its fallback
    assert fusion.effective_weights(curriculum.weights(0)) == {"a": 5.0, "b": 0.0}


# ---- three_phase -------------------------------------------------------------------------------
def test_three_phase_on_ten_steps_switches_at_20_and_60_percent(code_three_phase: TrainConfig) -> None:
    curriculum = curriculum_of(code_three_phase, 10)
    assert column(curriculum, "code_compiles", 10) == [0.7] * 2 + [0.3] * 4 + [0.1] * 4
    assert column(curriculum, "code_tests", 10) == [0.2] * 2 + [0.6] * 4 + [0.3] * 4
    assert column(curriculum, "code_style", 10) == [0.1] * 2 + [0.1] * 4 + [0.6] * 4
    assert column(curriculum, "code_similarity", 10) == [0.2] * 10  # not named by a phase: configured weight
    assert [curriculum.phase(s) for s in range(10)] == [0, 0, 1, 1, 1, 1, 2, 2, 2, 2]


def test_the_schedule_is_a_function_of_the_step_so_a_resumed_run_continues_it(code_three_phase: TrainConfig) -> None:
    before = curriculum_of(code_three_phase, 10)
    after_resume = curriculum_of(code_three_phase, 10)  # a fresh object, as after a restart
    assert [after_resume.weights(s) for s in range(4, 10)] == [before.weights(s) for s in range(4, 10)]
    assert before.weights(12) == before.weights(9)  # past the end: the last phase holds


def test_three_phase_yaml_is_the_built_in_schedule(code_three_phase: TrainConfig) -> None:
    assert code_three_phase.curriculum.phases == list(THREE_PHASE)
    library = dataclasses.replace(code_three_phase, curriculum=CurriculumConfig(name="three_phase"))
    assert [curriculum_of(library, 10).weights(s) for s in range(10)] == [
        curriculum_of(code_three_phase, 10).weights(s) for s in range(10)
    ]


# ---- linear ------------------------------------------------------------------------------------
def test_linear_blends_between_phase_midpoints_worked_numbers(code_three_phase: TrainConfig) -> None:
    # Midpoints of [0, .2), [.2, .6), [.6, 1]: 0.1, 0.4, 0.8.
    code_three_phase.curriculum.interpolate = "linear"
    curriculum = curriculum_of(code_three_phase, 10)
    approx = pytest.approx
    assert curriculum.weights(0)["code_compiles"] == 0.7  # before the first midpoint: held
    # p = 0.2: a third of the way from midpoint 0.1 to 0.4
    assert curriculum.weights(2) == approx(
        {
            "code_compiles": 0.7 - 0.4 / 3,
            "code_tests": 0.2 + 0.4 / 3,
            "code_style": 0.1,
            "code_similarity": 0.2,
            "code_efficiency": 0.0,
        }
    )
    # p = 0.6: half way from midpoint 0.4 to 0.8
    assert curriculum.weights(6) == approx(
        {"code_compiles": 0.2, "code_tests": 0.45, "code_style": 0.35, "code_similarity": 0.2, "code_efficiency": 0.0}
    )
    assert curriculum.weights(9) == approx(
        {"code_compiles": 0.1, "code_tests": 0.3, "code_style": 0.6, "code_similarity": 0.2, "code_efficiency": 0.0}
    )
    # On 20 steps p = 0.25 falls half way between 0.1 and 0.4.
    assert curriculum_of(code_three_phase, 20).weights(5)["code_compiles"] == approx(0.5)


@pytest.mark.parametrize("step", [1, 4, 8])  # p = 0.1, 0.4, 0.8: the midpoints
def test_linear_equals_step_at_phase_midpoints(code_three_phase: TrainConfig, step: int) -> None:
    stepped = curriculum_of(code_three_phase, 10)
    code_three_phase.curriculum.interpolate = "linear"
    assert curriculum_of(code_three_phase, 10).weights(step) == pytest.approx(stepped.weights(step))


def test_linear_announcements_say_where_the_blend_goes_and_the_last_phase_holds() -> None:
    curriculum = curriculum_of(composed("reward=code", "curriculum=three_phase", "curriculum.interpolate=linear"), 10)
    said = [line for s in range(10) if (line := curriculum.announcement(s, first=s == 0))]
    notes = [line.partition("(curriculum.interpolate=linear: ")[2] for line in said]
    assert notes == [
        "phase 1's weights to step 2, then blended towards phase 2's)",  # midpoint 0.1: step 2 of 10
        "blended towards phase 2's weights, reached at step 5, then towards phase 3's)",  # midpoint 0.4
        "blended towards phase 3's weights, reached at step 9 and held to the end)",  # the last: no next phase
    ]
    assert said[2].startswith(
        "curriculum three_phase: phase 3 of 3 from step 7 of 10 (60%): "
        "code_tests 0.45, code_compiles 0.2, code_style 0.35"  # half way from phase 2's to phase 3's
    )
    # a resume past the last midpoint: the weights no longer move
    assert curriculum.announcement(9, first=True).endswith(
        "(curriculum.interpolate=linear: phase 3's weights, held to the end)"
    )


def test_the_last_phase_lasts_to_the_end_of_the_run_whatever_its_until() -> None:
    """Phases ending at 0.4 and 0.8 on 10 steps: the last covers [0.4, 1], midpoint 0.7 (not 0.6)."""
    phases = (CurriculumPhase(0.4, {"exact_match": 2.0}), CurriculumPhase(0.8, {"exact_match": 0.0}))
    linear = curriculum_of(phased(*phases, interpolate="linear"), 10)
    # held to midpoint 0.2, then 2.0 -> 0.0 over the 0.5 of progress to midpoint 0.7
    assert column(linear, "exact_match", 10) == pytest.approx([2.0, 2.0, 2.0, 1.6, 1.2, 0.8, 0.4, 0.0, 0.0, 0.0])
    assert linear.announcement(4, first=False) == (
        "curriculum phased: phase 2 of 2 from step 5 of 10 (40%): exact_match 1.2, partial_credit 1 "
        "(curriculum.interpolate=linear: blended towards phase 2's weights, reached at step 8 and held to the end)"
    )
    stepped = curriculum_of(phased(*phases), 10)
    assert [stepped.phase(s) for s in range(10)] == [0] * 4 + [1] * 6  # p >= 0.8 too: still the last phase


def test_partial_to_exact_moves_weight_to_exact_match() -> None:
    curriculum = curriculum_of(composed("curriculum=partial_to_exact"), 20)  # midpoints 0.15, 0.5, 0.85
    approx = pytest.approx
    assert curriculum.weights(0) == {"exact_match": 0.2, "partial_credit": 1.0}
    assert curriculum.weights(3) == approx({"exact_match": 0.2, "partial_credit": 1.0})  # p = 0.15
    assert curriculum.weights(6) == approx({"exact_match": 0.2 + 0.8 * 3 / 7, "partial_credit": 1.0 - 0.5 * 3 / 7})
    assert curriculum.weights(10) == approx({"exact_match": 1.0, "partial_credit": 0.5})  # p = 0.5
    assert curriculum.weights(19) == approx({"exact_match": 1.0, "partial_credit": 0.2})


# ---- user phases -------------------------------------------------------------------------------
def test_user_phases_from_the_command_line() -> None:
    cfg = composed("curriculum=phased", USER_PHASES)
    assert cfg.curriculum.phases == [
        CurriculumPhase(until=0.5, weights={"exact_match": 2.0}),
        CurriculumPhase(until=1.0, weights={"exact_match": 1.0}),
    ]
    assert validate(cfg) == []
    curriculum = curriculum_of(cfg, 4)
    assert column(curriculum, "exact_match", 4) == [2.0, 2.0, 1.0, 1.0]
    assert column(curriculum, "partial_credit", 4) == [1.0] * 4


def test_every_shipped_option_composes_with_the_schema() -> None:
    for option in ("constant", "three_phase", "phased", "partial_to_exact"):
        assert validate(composed(f"curriculum={option}")) == []
    assert composed("curriculum=constant").curriculum == TrainConfig().curriculum


# ---- errors ------------------------------------------------------------------------------------
def test_three_phase_with_the_arithmetic_rewards_names_what_it_expects_and_how_to_write_phases() -> None:
    cfg = TrainConfig()
    cfg.curriculum = CurriculumConfig(name="three_phase")
    with pytest.raises(GrpoError) as err:
        curriculum_of(cfg)
    message = str(err.value)
    assert "weights code_compiles, code_style, code_tests" in message
    assert "reward.functions has exact_match, partial_credit" in message
    assert "reward=code" in message
    assert "curriculum=phased 'curriculum.phases=[{until:0.5,weights:{exact_match:2.0}}" in message
    assert "--config-dir" in message


def test_a_phase_naming_an_unknown_function_lists_both_sets() -> None:
    cfg = composed("curriculum=phased", "curriculum.phases=[{until:0.5,weights:{exact_match:2.0}},{weights:{exact:1}}]")
    with pytest.raises(GrpoError, match=r"curriculum\.phases\[1\]\.weights: reward function\(s\) exact not in") as err:
        curriculum_of(cfg)
    assert "the phases name exact, exact_match, reward.functions has exact_match, partial_credit" in str(err.value)


def phased(*phases: CurriculumPhase, name: str = "phased", interpolate: str = "step") -> TrainConfig:
    cfg = TrainConfig()
    cfg.curriculum = CurriculumConfig(name=name, interpolate=interpolate, phases=list(phases))
    return cfg


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        (
            phased(CurriculumPhase(0.6), CurriculumPhase(0.2)),
            "invalid value curriculum.phases[1].until=0.2: must be greater than curriculum.phases[0].until=0.6",
        ),
        (phased(CurriculumPhase(0.5), CurriculumPhase(0.5)), "curriculum.phases[1].until=0.5: must be greater"),
        (phased(CurriculumPhase(0.0)), "invalid value curriculum.phases[0].until=0.0: must be in (0, 1]"),
        (phased(CurriculumPhase(0.5), CurriculumPhase(1.5)), "curriculum.phases[1].until=1.5: must be in (0, 1]"),
        (
            phased(CurriculumPhase(1.0, {"exact_match": -1.0})),
            "invalid value curriculum.phases[0].weights.exact_match=-1.0: must be a finite number >= 0",
        ),
        (
            phased(CurriculumPhase(1.0, {"exact_match": 0.0, "partial_credit": 0.0})),
            "curriculum.phases[0] leaves every reward function at weight 0",
        ),
        (phased(), "curriculum=phased needs its phases, e.g. on the command line 'curriculum.phases=[{until:0.5"),
        (
            phased(CurriculumPhase(1.0, {"exact_match": 2.0}), name="constant"),
            "curriculum.name=constant uses the weights in reward.functions and would ignore the 1 curriculum.phases",
        ),
        (phased(name="linear"), "invalid value curriculum.name='linear': must be one of constant, three_phase, phased"),
        (phased(interpolate="cosine"), "invalid value curriculum.interpolate='cosine': must be one of step, linear"),
    ],
)
def test_bad_curricula_fail_at_construction_naming_the_key(cfg: TrainConfig, message: str) -> None:
    with pytest.raises(GrpoError) as err:
        curriculum_of(cfg)
    assert message in str(err.value)


def test_validate_checks_the_names_too() -> None:
    cfg = phased(interpolate="smooth")
    with pytest.raises(GrpoError, match=r"curriculum\.interpolate='smooth': must be one of step, linear"):
        validate(cfg)


# ---- in the trainer ----------------------------------------------------------------------------
def test_the_trainer_logs_three_phases_of_code_weights_and_the_adaptive_clip(tmp_path) -> None:
    """`grpo train reward=code curriculum=three_phase train.steps=10`, shrunk to seconds on a CPU."""
    cfg = composed(
        "reward=code",
        "curriculum=three_phase",
        "train.steps=10",
        "train.prompts_per_step=2",
        "rollout.num_generations=2",
        "rollout.max_new_tokens=8",
        "algo.adaptive_clip.enabled=true",
        "sandbox.workers=1",
    )
    from grpo_cli.monitor.console import TrainingConsole
    from grpo_cli.training import GRPOTrainer

    printed = io.StringIO()
    console = TrainingConsole(10, "plain", Console(file=printed, width=300), print_every=100)
    log_file = logging.FileHandler(tmp_path / "train.log")  # what the CLI's job logging attaches
    logging.getLogger().addHandler(log_file)
    trainer = GRPOTrainer(cfg, tmp_path, observers=[console])
    trainer.setup()
    try:
        with console:
            history = trainer.train()
    finally:
        logging.getLogger().removeHandler(log_file)
        log_file.close()
    trainer.cleanup()
    # each phase change is announced once, on the console and in train.log, with the new weights
    announced = [line for line in printed.getvalue().splitlines() if "curriculum three_phase" in line]
    assert announced == [
        "step 1: curriculum three_phase: phase 1 of 3 from step 1 of 10 (0%): code_tests 0.2, code_compiles 0.7, "
        "code_style 0.1, code_similarity 0.2, code_efficiency 0",
        "step 3: curriculum three_phase: phase 2 of 3 from step 3 of 10 (20%): code_tests 0.6, code_compiles 0.3, "
        "code_style 0.1, code_similarity 0.2, code_efficiency 0",
        "step 7: curriculum three_phase: phase 3 of 3 from step 7 of 10 (60%): code_tests 0.3, code_compiles 0.1, "
        "code_style 0.6, code_similarity 0.2, code_efficiency 0",
    ]
    logged = (tmp_path / "train.log").read_text().splitlines()
    assert [line for line in logged if "curriculum three_phase" in line] == announced
    assert [row["weight/code_compiles"] for row in history] == [0.7] * 2 + [0.3] * 4 + [0.1] * 4
    assert [row["weight/code_style"] for row in history] == [0.1] * 6 + [0.6] * 4
    assert {row["weight/code_similarity"] for row in history} == {0.2}  # named by no phase
    assert [row["clip/epsilon_low"] for row in history[:2]] == [0.15, 0.15]  # base until two batches are seen
    assert all(0.05 <= row["clip/epsilon_low"] <= 0.3 for row in history)
