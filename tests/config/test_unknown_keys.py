"""A misspelled key is refused wherever it is written, list elements included, with the full key
and the nearest valid one: on the command line (`+key=value` too), in a user's primary config, in
a user's own group option file."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException

from grpo_cli.commands.overrides import check_overrides
from grpo_cli.config.schema import ScoreConfig, TrainConfig
from grpo_cli.errors import GrpoError
from tests.conftest import run_grpo

TYPO_IN_A_LIST = "functions:\n  - name: a\n    target: exact_match\n    wieght: 2\n"


def _refused(argv: list[str], schema: type = TrainConfig) -> str:
    with pytest.raises(GrpoError) as info:
        check_overrides(argv, schema)
    return str(info.value)


@pytest.mark.parametrize(
    ("override", "meant"),
    [
        ("+reward.functions.0.wieght=2", "reward.functions.0.weight"),
        ("reward.functions.1.targte=x", "reward.functions.1.target"),
        ("+curriculum.phases.0.untill=0.5", "curriculum.phases.0.until"),
        ("+optm.lr=1", "optim.lr"),
        ("+reward.functions.exact_match.weight=2", "reward.functions.0.weight"),
    ],
)
def test_override_typos_under_list_indices_are_refused(override: str, meant: str) -> None:
    message = _refused([override])
    assert f"unknown config key {override.lstrip('+').split('=')[0]}" in message
    assert f"did you mean {meant}?" in message


@pytest.mark.parametrize(
    "override",
    ["+reward.functions.0.kwargs.threshold=0.5", "reward.functions.0.weight=2", "+curriculum.phases.0.until=0.5"],
)
def test_valid_overrides_under_list_indices_pass(override: str) -> None:
    check_overrides([override], TrainConfig)


def test_score_checks_its_own_schema() -> None:
    assert "did you mean reward.functions.0.weight?" in _refused(["+reward.functions.0.wieght=2"], ScoreConfig)
    assert "did you mean batch_size?" in _refused(["batch_sise=3"], ScoreConfig)


def test_primary_config_typo_inside_a_list_names_file_and_key(tmp_path: Path) -> None:
    recipe = tmp_path / "mine.yaml"
    body = "\n".join("  " + line for line in TYPO_IN_A_LIST.splitlines())
    recipe.write_text(f"defaults:\n  - train\n  - _self_\nreward:\n{body}\n")
    message = _refused(["--config-dir", str(tmp_path), "-cn", "mine"])
    assert message == (
        f"{recipe}: unknown config key reward.functions.0.wieght; did you mean reward.functions.0.weight?"
    )


def test_group_option_typo_from_config_dir_names_file_and_key(tmp_path: Path) -> None:
    option = tmp_path / "reward" / "mine.yaml"
    option.parent.mkdir()
    option.write_text(TYPO_IN_A_LIST)
    expected = f"{option}: unknown config key reward.functions.0.wieght; did you mean reward.functions.0.weight?"
    assert _refused(["--config-dir", str(tmp_path), "reward=mine"]) == expected
    assert _refused(["--config-dir", str(tmp_path), "-m", "reward=arithmetic,mine"]) == expected
    # Selected from the user's primary config rather than the command line.
    (tmp_path / "recipe.yaml").write_text("defaults:\n  - train\n  - override reward: mine\n  - _self_\n")
    assert _refused(["--config-dir", str(tmp_path), "-cn", "recipe"]) == expected


def test_a_clean_group_option_from_config_dir_passes(tmp_path: Path) -> None:
    option = tmp_path / "reward" / "mine.yaml"
    option.parent.mkdir()
    option.write_text(TYPO_IN_A_LIST.replace("wieght", "weight") + "    kwargs: {anything: 1}\n")
    check_overrides(["--config-dir", str(tmp_path), "reward=mine"], TrainConfig)


# ---- group options ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("override", "says"),
    [
        (
            "curriculum=three_phse",
            "invalid value curriculum='three_phse': must be one of constant, partial_to_exact, "
            "phased, three_phase, three_phase_efficiency; did you mean three_phase?",
        ),
        (
            "algo=dapoo",
            "invalid value algo='dapoo': must be one of cispo, dapo, dr_grpo, grpo, gspo, luspo, sapo, "
            "trl_defaults, vespo; did you mean dapo?",
        ),
        (
            "reward=nonexistent",
            "invalid value reward='nonexistent': must be one of arithmetic, code, exact_match, "
            "format, last_number, math, overlong",
        ),
        ("-m reward=arithmetic,mth", "invalid value reward='mth': must be one of "),
        ("debug=null", "debug=null: a group choice cannot be null; ~debug drops the group"),
    ],
)
def test_a_group_option_typo_is_one_line_with_the_nearest_and_the_list(override: str, says: str) -> None:
    """Hydra printed a 14-line block with its search path."""
    assert _refused(override.split()).startswith(says)


def test_a_users_own_option_and_the_packaged_ones_pass(tmp_path: Path) -> None:
    (tmp_path / "reward").mkdir()
    (tmp_path / "reward" / "mine.yaml").write_text("functions:\n  - name: a\n    target: exact_match\n")
    check_overrides(["--config-dir", str(tmp_path), "-m", "reward=mine,math", "algo=dapo", "debug=smoke"], TrainConfig)
    assert "did you mean mine?" in _refused(["--config-dir", str(tmp_path), "reward=mie"])
    (tmp_path / "recipe.yaml").write_text("defaults:\n  - train\n  - override algo: dapoo\n  - _self_\n")
    message = _refused(["--config-dir", str(tmp_path), "-cn", "recipe"])
    assert (
        message.startswith(f"{tmp_path / 'recipe.yaml'}: invalid value algo='dapoo'")
        and "did you mean dapo?" in message
    )


def test_a_sweep_with_cfg_is_one_line_not_a_traceback() -> None:
    message = _refused(["-m", "optim.lr=1e-3,2e-3", "--cfg", "job"])
    assert message.startswith("-m with --cfg job: --cfg prints one composed config, and -m composes one per job")
    assert _refused(["--cfg", "job", "--info"]).startswith("--cfg with --info: give one of")
    check_overrides(["optim.lr=1e-3", "--cfg", "job"], TrainConfig)


# ---- as a user sees it ------------------------------------------------------------------------------
def test_cli_refuses_a_typo_under_a_list_index() -> None:
    result = run_grpo("train", "+reward.functions.0.wieght=2", "--cfg", "job")
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    assert "unknown config key reward.functions.0.wieght; did you mean reward.functions.0.weight?" in result.stderr
    assert "Traceback" not in output


def test_hydra_alone_also_refuses_a_typo_in_a_group_file(tmp_path: Path) -> None:
    """Without our check (an option selected where it does not look, e.g. a nested default),
    Hydra's structured-config merge still refuses the key, without its path: belt and braces."""
    from hydra import compose, initialize_config_dir

    from grpo_cli.commands.entry import register_schemas

    register_schemas()
    (tmp_path / "reward").mkdir()
    (tmp_path / "reward" / "mine.yaml").write_text(TYPO_IN_A_LIST)
    (tmp_path / "recipe.yaml").write_text("defaults:\n  - train\n  - _self_\n")
    with initialize_config_dir(str(tmp_path), version_base=None):
        with pytest.raises(
            ConfigCompositionException, match="(?s)reward/mine.*Key 'wieght' not in 'RewardFunctionConfig'"
        ):
            compose(config_name="recipe", overrides=["hydra.searchpath=[pkg://grpo_cli.conf]", "reward=mine"])
