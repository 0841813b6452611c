"""Plain config trees as {dotted key: value}.

Its own module so that the rollout stream and training resume, which compare a saved config with
the current one key by key, can flatten a tree without importing the config checks.
"""

from __future__ import annotations

import typing


def flatten(node: typing.Any, prefix: str = "") -> dict[str, typing.Any]:
    """A plain config tree (dicts, lists) as {dotted key: value}; lists of mappings get index keys.

    >>> flatten({"optim": {"lr": 0.1, "betas": [0.9, 0.99]}, "reward": {"functions": [{"name": "a"}]}})
    {'optim.lr': 0.1, 'optim.betas': [0.9, 0.99], 'reward.functions.0.name': 'a'}
    """
    if isinstance(node, dict):
        out: dict[str, typing.Any] = {}
        for key, value in node.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    if isinstance(node, (list, tuple)) and any(isinstance(v, (dict, list)) for v in node):
        out = {}
        for i, value in enumerate(node):
            out.update(flatten(value, f"{prefix}{i}."))
        return out
    return {prefix[:-1]: list(node) if isinstance(node, tuple) else node}
