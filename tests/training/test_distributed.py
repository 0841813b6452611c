"""`World.gather_scores` (training/distributed.py): two real processes (gloo on 127.0.0.1) each score
their share of a batch and fuse the gathered scores; the result must be the one a single process
gets scoring the whole batch. Issue 33 item 1: the gather rebuilt each function's scores from
(values, error, elapsed) and lost the rows a function raised on and the rows missing its column,
so with 2 processes a function whose rows all lack its column was a failed batch (masked, where one
process keeps it), a raised row's floor went NaN, and the per-row alerts went silent."""

from __future__ import annotations

import json
import math
import socket
from pathlib import Path

import torch.multiprocessing as mp

from grpo_cli.config.schema import RewardFunctionConfig, SandboxConfig
from grpo_cli.rewards import RewardBatch, RewardExecutor, RewardFusion, resolve_reward_sources, score_batch
from grpo_cli.training.distributed import World

GROUP = 2
ROWS = [{"prompt": "p0", "hint": "h"}, {"prompt": "p1"}, {"prompt": "p2"}, {"prompt": "p3", "hint": "h"}]
COMPLETIONS = ["a", "boom", "ccc", "dd", "boom", "e", "ff", "g"]  # 4 groups of 2: two per process


def functions() -> list[RewardFunctionConfig]:
    """`picky` raises on "boom" (score_each isolates it); `em` needs an `answer` no row has; `hinted`
    needs a `hint` half the rows lack. max_consecutive_failures=1: one failed batch masks."""
    return [
        RewardFunctionConfig(name="picky", target="tests.rewards.pool_functions:picky"),
        RewardFunctionConfig(name="em", target="tests.training.test_distributed:needs_answer", weight=0.5),
        RewardFunctionConfig(name="hinted", target="tests.training.test_distributed:needs_hint", weight=0.25),
    ]


def needs_answer(prompts: list[str], completions: list[str], answer: list[str], **_: object) -> list[float]:
    return [float(c == a) for c, a in zip(completions, answer)]


def needs_hint(prompts: list[str], completions: list[str], hint: list[str], **_: object) -> list[float]:
    return [float(len(c)) for c in completions]


def batch_of(rows: list[dict], completions: list[str]) -> RewardBatch:
    return RewardBatch.from_groups(rows, completions, [1] * len(completions), GROUP)


def fused_figures(world: World, rows: list[dict], completions: list[str]) -> dict:
    """Score this process's batch, gather (a no-op alone), fuse: what the trainer's step does."""
    sources = resolve_reward_sources(functions(), sandbox=SandboxConfig())
    fusion = RewardFusion(sources, max_consecutive_failures=1)
    with RewardExecutor(num_workers=0, default_timeout_s=0) as executor:
        scores = score_batch(executor, fusion, batch_of(rows, completions), world.gather_scores)
    result = fusion.fuse(scores, GROUP)
    encode = lambda values: [None if math.isnan(v) else v for v in values]  # noqa: E731 (JSON has no NaN)
    return {
        "fused": encode(result.fused),
        "raw": encode(result.raw),
        "per_function": {name: encode(values) for name, values in result.per_function.items()},
        "alerts": result.alerts,
        "masked": result.masked,
    }


def _share(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        half = len(ROWS) // 2
        rows, completions = ROWS[rank * half : (rank + 1) * half], COMPLETIONS[rank * 4 : rank * 4 + 4]
        figures = fused_figures(World(rank, 2), rows, completions)
        Path(out, f"rank{rank}.json").write_text(json.dumps(figures))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_fuse_the_gathered_scores_as_one_process_fuses_the_whole_batch(tmp_path: Path) -> None:
    alone = fused_figures(World.single(), ROWS, COMPLETIONS)
    assert alone["masked"] == []  # the premise: alone, no function fails its batch
    assert alone["per_function"]["picky"][1] == 0.0  # a raised row scores the floor (on_row_error=zero)
    assert any("raised on 2 of 8" in a for a in alone["alerts"]) and any("'answer'" in a for a in alone["alerts"])
    mp.spawn(_share, args=(_free_port(), str(tmp_path)), nprocs=2, join=True)
    for rank in (0, 1):  # every process fuses the same global batch into the same figures
        assert json.loads((tmp_path / f"rank{rank}.json").read_text()) == alone
