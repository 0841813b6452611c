"""An agent written with the `openai` package, as agents are written every day: nothing in it knows
grpo. `grpo train` runs it once per episode against an OpenAI-compatible endpoint backed by the
policy, and trains on the tokens the endpoint sampled:

    grpo train env=agent env.agent=examples/openai_agent.py:run \
        'reward.functions=[{name: env_reward, target: env_reward}, {name: credit, target: answer_partial_credit}]'

It asks the row's question, then asks the model to check its answer, and returns 1.0 when the
checked answer is the row's, else 0.0: the episode's reward (the `env_reward` column). Returning
None leaves the reward to `reward.functions`, which score the last reply and see the transcript.
"""

from __future__ import annotations

from typing import Any

from openai import OpenAI

SYSTEM = "You are good at arithmetic. Answer with the number only."


def run(base_url: str, api_key: str, row: dict[str, Any]) -> float | None:
    """One episode: two requests to the policy, then a reward for the final answer."""
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)  # a failed request is the episode's
    messages: list[Any] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": str(row["prompt"])}]
    first = client.chat.completions.create(model="policy", messages=messages)
    messages.append(first.choices[0].message)  # the reply as the SDK returned it, sent back unchanged
    messages.append({"role": "user", "content": "Check it. The number only:"})
    second = client.chat.completions.create(model="policy", messages=messages)
    answer = (second.choices[0].message.content or "").strip()
    if "answer" not in row:
        return None  # no reference: the reward functions decide
    return float(answer == str(row["answer"]).strip())
