"""The engine's per-token log-probs reach the Rollout (algo.rollout_correction), from vLLM-shaped
outputs of a stand-in engine that returns known log-probs (vLLM's API, not our code), and the
trainer's update weighs by them."""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import pytest
import torch

from grpo_cli.config.schema import AlgoConfig, RolloutConfig, RolloutCorrectionConfig
from grpo_cli.core.logprobs import rows_logprobs
from grpo_cli.rollout import VLLMGenerator
from tests.core.test_update import run_update
from tests.rollout.test_vllm_backend import StandInLLM, tiny  # noqa: F401 (tiny: the fixture)


class LogprobEngine(StandInLLM):
    """Each completion also carries vLLM's `logprobs`: per position {sampled id: Logprob}, as
    SamplingParams(logprobs=0) returns them; -0.1·(position + 1) for every row. None when
    SamplingParams(logprobs=None), as vLLM."""

    def generate(self, prompts, sampling_params, use_tqdm):
        outputs = super().generate(prompts, sampling_params, use_tqdm)
        if self.calls[-1][1]["logprobs"] is None:  # as vLLM: none asked, none returned
            return outputs
        for request in outputs:
            for completion in request.outputs:
                completion.logprobs = [
                    {token: SimpleNamespace(logprob=-0.1 * (i + 1), rank=1)}
                    for i, token in enumerate(completion.token_ids)
                ]
        return outputs


def test_engine_log_probs_are_kept_row_by_row_and_weigh_the_update(tiny) -> None:  # noqa: F811
    model, tokenizer, ids, mask = tiny
    eos = tokenizer.eos_token_id
    a, b = tokenizer.encode("19"), tokenizer.encode("7")
    script = [[(a + [eos], "stop", eos), (b, "stop", eos)]] * 3  # the second row's EOS stripped: put back
    cfg = RolloutConfig(max_new_tokens=4, num_generations=2)
    engine = LogprobEngine(script)
    generator = VLLMGenerator(model, tokenizer, cfg, engine=engine, sampling_params=dict, push=lambda weights: None)
    rollout = generator.generate(ids, mask, 2)
    assert engine.calls[0][1]["logprobs"] == 0  # the sampled token's own log-prob only
    width = rollout.completion_ids.size(1)
    first = [-0.1 * (i + 1) for i in range(len(a) + 1)]
    second = [-0.1 * (i + 1) for i in range(len(b))] + [math.nan]  # the EOS put back has no engine figure
    for row in range(0, 6, 2):
        assert rollout.engine_logps[row].tolist()[: len(first)] == pytest.approx(first)
        got = rollout.engine_logps[row + 1].tolist()
        assert got[: len(b)] == pytest.approx(second[: len(b)]) and math.isnan(got[len(b)])
    assert rollout.engine_logps.shape == (6, width)

    with torch.no_grad():
        policy, _ = rows_logprobs(model, rollout, torch.arange(6), 1.0, "padded", with_entropy=False)
    loss_mask = rollout.completion_mask.float()
    log_ratio = torch.nan_to_num(policy - rollout.engine_logps, nan=0.0)
    expected = (log_ratio.exp().clamp(max=2.0) * loss_mask).sum() / loss_mask.sum()
    algo = AlgoConfig(rollout_correction=RolloutCorrectionConfig(mode="token_truncate", cap=2.0))
    stats, _, _ = run_update(copy.deepcopy(model), rollout, torch.randn(6), algo=algo)
    assert stats.metrics()["rollout_correction/weight"] == pytest.approx(expected.item(), rel=1e-5)
    assert expected < 0.5  # the random policy is far less sure than this engine: weights below 1, none capped
    assert stats.metrics()["rollout_correction/capped"] == 0.0
    assert generator.generate(ids, mask, 2, greedy=True).engine_logps is None  # greedy asks for none
