"""TRL's reward-function convention beside ours, so a function written for TRL's GRPOTrainer runs unchanged.

Ours calls `f(prompts, completions, **columns)` with texts. TRL 1.16 calls every keyword by name:
`f(prompts=, completions=, completion_ids=, trainer_state=, log_extra=, log_metric=, **columns)`, and
for a conversational data set hands each prompt as its messages and each completion as
`[{"role": "assistant", "content": text}]`. A function is called TRL's way when its signature asks
for it (`calling_convention`), or when its `reward.functions` entry says `calling: trl`.

On a multi-turn rollout (env.*) TRL's trainer, whose environments always run on conversational data,
hands each completion as the whole conversation after the prompt (every model turn and the
environment's messages between them) and adds `environments`, each completion's environment
instance (`environment_factory`'s); so does this wrapper, from the `MULTI_TURN_COLUMNS` the scoring
adds (`multi_turn_columns`). Those columns reach only a function that names them (the wrapper
does), as `completion_ids`: they are live objects and whole conversations.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from grpo_cli.errors import GrpoError
from grpo_cli.rewards.batch import COMPLETION_IDS

if TYPE_CHECKING:
    from transformers import TrainerState

CALLING_CONVENTIONS = ("auto", "grpo", "trl")  # RewardFunctionConfig.calling
ENVIRONMENTS = "environments"  # TRL's keyword: each completion's environment instance (multi-turn only)
CONVERSATIONS = "env_messages"  # each multi-turn completion's conversation after the prompt, as messages
MULTI_TURN_COLUMNS = (ENVIRONMENTS, CONVERSATIONS)  # hidden from a function that does not name them
# what TRL passes besides prompts, completions and the data's columns; a parameter named so asks for TRL's call
TRL_KEYWORDS = (COMPLETION_IDS, "trainer_state", "log_extra", "log_metric", ENVIRONMENTS)
SIGNATURES = (
    "f(prompts, completions, **columns) with texts (grpo's), or TRL's keyword call: "
    "f(completions, **kwargs), f(prompts, completions, completion_ids, **kwargs), ... "
    f"(keywords {', '.join(('prompts', 'completions', *TRL_KEYWORDS))} and the data's columns)"
)


def calling_convention(fn: Callable[..., Any], calling: str = "auto") -> str:
    """ "grpo" or "trl". `auto` picks TRL's when ours cannot be what the function means: it does not
    take (prompts, completions) as its first two positional parameters (TRL's documented
    `def f(completions, **kwargs)`), or it names a keyword only TRL passes (`completion_ids`, ...).

    >>> def ours(prompts, completions, answer, **_): ...
    >>> def trls(completions, **kwargs): ...
    >>> def with_ids(prompts, completions, completion_ids, **kwargs): ...
    >>> [calling_convention(f) for f in (ours, trls, with_ids)]
    ['grpo', 'trl', 'trl']
    """
    if calling != "auto":
        return calling
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return "grpo"  # builtins without an introspectable signature: ours
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    positional = [name for name, p in params.items() if p.kind in kinds]
    takes_ours = positional[:2] == ["prompts", "completions"] or (
        len(positional) < 2 and any(p.kind is p.VAR_POSITIONAL for p in params.values())
    )
    return "trl" if not takes_ours or any(k in params for k in TRL_KEYWORDS) else "grpo"


class LoggedScores(list):
    """A TRL-style function's scores, a plain list to every caller, with what it logged through
    `log_metric` (name -> values) and `log_extra` (column -> one value per completion)."""

    def __init__(
        self,
        values: Iterable[float | None] = (),
        metrics: dict[str, list[float]] | None = None,
        extra: dict[str, list[Any]] | None = None,
    ) -> None:
        super().__init__(values)
        self.metrics: dict[str, list[float]] = dict(metrics or {})
        self.extra: dict[str, list[Any]] = dict(extra or {})


def multi_turn_columns(messages: list[Any] | None, environments: list[Any] | None) -> dict[str, list[Any]]:
    """A multi-turn rollout's conversations and environment instances as batch columns (none for a
    single-turn rollout, which has neither), for `TrlStyleReward` to hand over as TRL does."""
    columns: dict[str, list[Any]] = {}
    if messages is not None:
        columns[CONVERSATIONS] = [list(conversation) for conversation in messages]
    if environments is not None:
        columns[ENVIRONMENTS] = list(environments)
    return columns


def as_messages(prompt: Any) -> list[dict[str, Any]]:
    """A prompt as TRL's conversational data holds it: its messages (a text prompt is one user message)."""
    return list(prompt) if isinstance(prompt, list) else [{"role": "user", "content": prompt}]


class TrlStyleReward:
    """A TRL-style reward function behind our convention: the executor calls it as ours
    (`prompts, completions, **columns`), it calls the function as TRL would.

    It keeps a reference to the run's `TrainerState` (transformers' own class, what TRL hands
    over), which the trainer moves on each step; a worker process gets the state of the step it
    scores, since the function travels pickled with each batch. `log_metric` and `log_extra` are
    collected per call and travel back with the scores (`LoggedScores`), so they work in a worker
    process too.
    """

    def __init__(self, fn: Callable[..., Any], conversational: bool, state: TrainerState | None = None) -> None:
        self.fn = fn
        self.conversational = conversational
        if state is None:
            from transformers import TrainerState  # only for a TRL-style function: transformers is slow to import

            state = TrainerState()
        self.state = state
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)
        self.__signature__ = _our_signature(fn)
        params = inspect.signature(fn).parameters
        self._takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
        self._takes = set(params)

    def __call__(self, prompts: Sequence[Any], completions: Sequence[str], **columns: Any) -> LoggedScores:
        metrics: dict[str, list[float]] = {}
        extra: dict[str, list[Any]] = {}

        def log_metric(name: str, value: float) -> None:
            metrics.setdefault(str(name), []).append(float(value))

        def log_extra(column: str, values: Sequence[Any]) -> None:
            extra[str(column)] = list(values)

        conversations = columns.pop(CONVERSATIONS, None)
        environments = columns.pop(ENVIRONMENTS, None)
        if conversations is not None:  # multi-turn: TRL's environments run on conversational data only
            prompts = [as_messages(p) for p in prompts]
            completions = [list(c) for c in conversations]  # type: ignore[misc]
        elif self.conversational or any(isinstance(p, list) for p in prompts):
            prompts = [as_messages(p) for p in prompts]
            completions = [[{"role": "assistant", "content": c}] for c in completions]  # type: ignore[misc]
        if environments is not None:  # TRL passes the keyword only when there are environments
            columns[ENVIRONMENTS] = environments
        offered = {
            "prompts": list(prompts),
            "completions": list(completions),
            COMPLETION_IDS: columns.pop(COMPLETION_IDS, None),
            "trainer_state": self.state,
            "log_extra": log_extra,
            "log_metric": log_metric,
            **columns,
        }
        values = self.fn(**{k: v for k, v in offered.items() if self._takes_any or k in self._takes})
        return LoggedScores(values, metrics, extra)


def _our_signature(fn: Callable[..., Any]) -> inspect.Signature:
    """The signature the start-up checks and the executor read: ours, with the function's own data
    columns (a parameter without a default is a column it needs), `completion_ids` and the
    multi-turn columns (named, so the executor hands them over)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError) as err:
        raise GrpoError(f"a TRL-style reward needs an introspectable signature: {err}") from None
    own = {"prompts", "completions", *TRL_KEYWORDS, CONVERSATIONS}
    columns = [
        p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
        for p in params
        if p.name not in own and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    positional = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in ("prompts", "completions")]
    named = [
        inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=None)
        for n in (COMPLETION_IDS, *MULTI_TURN_COLUMNS)
    ]
    rest = inspect.Parameter("columns", inspect.Parameter.VAR_KEYWORD)
    return inspect.Signature([*positional, *columns, *named, rest])
