"""`rollout.max_staleness` = k >= 1: the sampler runs in a thread of its own, up to k policy versions
ahead of the update, so generation and training overlap (docs/scaling.md#asynchronous-rollouts).

The lag is fixed, not "at most": batch j is sampled by the weights of version max(s0, j − k), where
version v is the policy after v training steps and s0 the step the run (or its resume) started at.
So every batch's staleness is known before it is sampled, a run is reproducible and a resume replays
the straight run's prompts, and the bound cannot be exceeded by a slow learner or a fast sampler:
whichever side is ahead waits (the idle shares below say who). verl's one-step-off pipeline and
prime-rl's `async_level` keep the same fixed lag.

The hand-off, per training step s (the learner's thread):
1. `take(s)`: batch s, waiting for it if the sampler is behind (learner idle);
2. scoring, advantages, the update (the trainer, unchanged);
3. `publish(s + 1)`: once the sampler has finished batch s + k (the last one version s samples),
   the sampler's weights take version s + 1 (`refresh`, called here while the sampler waits), and
   batch s + 1 + k is ordered: its prompts drawn from the one PromptSampler, on this thread.
The sampler's thread only samples: it never reads the live policy, draws from a stream seeded per
batch (`World.sampling_seed`), and holds its own tokenizer and weights. Scoring, the fusion's state,
the curriculum and every collective stay on the learner's thread, in step order.

State: this object stands in the TrainState for the PromptSampler (the same two integers), saved as
of the learner's step, not the sampler's, and with them the batches already sampled for the steps
after it (by older weights than the checkpoint's): a resume trains those, then samples on from the
checkpoint's weights, exactly as the straight run did. Where they cannot travel (data-parallel, each
process's share would need gathering; live environment objects, env=trl), a resume samples them
again from the checkpoint's weights: the same prompts, fresher weights (staleness 0, then back to k).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from grpo_cli.data import PromptSampler
from grpo_cli.rollout import Rollout

POLL_S = 0.05  # how often a wait looks for the other side's failure (and lets Ctrl-C through)


@dataclass
class SampledBatch:
    """One step's rollout, as the sampler hands it over."""

    step: int  # the training step it is for
    examples: list[dict[str, Any]]  # the step's global prompts (every process draws the same)
    rollout: Rollout  # this process's share, sampled
    version: int  # the policy version that sampled it: the training steps its weights had taken
    generate_s: float  # seconds the sampler spent on it

    def staleness(self) -> int:
        """Policy versions between the weights that sampled this batch and the ones it trains."""
        return self.step - self.version


@dataclass
class CoreSplit:
    """A CPU run's cores, halved between the two threads, so sampling and training overlap on a CPU
    as on two devices (vLLM's engine binds its own: rollout.vllm)."""

    learner: set[int]
    sampler: set[int]
    threads: int | None  # torch's threads while the pipeline runs (each side's half); None: train.threads as set

    def describe(self) -> str:
        return f"learner on cores {sorted(self.learner)}, sampler on {sorted(self.sampler)}"


def split_cores(device: torch.device, threads: int) -> CoreSplit | None:
    """Two disjoint halves of this process's cores, the learner's the first, where there are two or
    more on a CPU (Linux affinity); `threads` is train.threads, kept when set (> 0)."""
    if device.type != "cpu" or not hasattr(os, "sched_getaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return None
    half = len(cores) // 2
    return CoreSplit(set(cores[:half]), set(cores[half:]), None if threads > 0 else half)


class AsyncRollouts:
    """The sampler's thread and its hand-off with the learner (module docstring).

    `sample(step, examples)` is the sampler's whole job for one batch (runs on its thread);
    `refresh()` gives the sampler's weights the policy's (runs on the learner's thread while the
    sampler waits); `steps` is train.steps; `cores`, when given, pins each side to its half (CPU);
    `carry`: sampled batches travel in the state (module docstring), with `settings` (what decides
    a batch: a resume under others samples them again)."""

    def __init__(
        self,
        sample: Callable[[int, list[dict[str, Any]]], Rollout],
        refresh: Callable[[], None],
        prompts: PromptSampler,
        prompts_per_step: int,
        max_staleness: int,
        steps: int,
        cores: CoreSplit | None = None,
        carry: bool = True,
        settings: str = "",
    ) -> None:
        self.sample = sample
        self.refresh = refresh
        self.prompts = prompts
        self.prompts_per_step = prompts_per_step
        self.k = max_staleness
        self.steps = steps  # the run's length: no batch is ordered past its last step
        self.cores = cores
        self.carry = carry
        self.settings = settings
        self.pending: dict[int, SampledBatch] = {}  # sampled batches a checkpoint or rollback brought back
        self.changed = threading.Condition()  # guards everything below; notified on every change
        self.thread: threading.Thread | None = None
        self.run_id = 0  # which start the running thread belongs to: a thread let go finds it changed and stops
        self.position = 0  # the learner's step: the state a checkpoint saves is the prompts' before it
        self.drawn_before: dict[int, dict[str, int]] = {}  # step -> the PromptSampler's state before its draw
        self.orders: dict[int, list[dict[str, Any]]] = {}  # ordered batches not yet sampled
        self.ready: dict[int, SampledBatch] = {}  # sampled batches not yet taken
        self.version = 0  # the sampler's weights' version
        self.sampled_through = -1  # the last batch the sampler finished
        self.failure: BaseException | None = None  # the sampler's, raised on the learner's thread
        self.sampler_idle_s = 0.0  # the sampler's waiting since the learner last asked
        self.learner_idle_s = 0.0  # the learner's waiting in this step
        self.busy: list[tuple[float, float]] = []  # the sampler's (start, end) of each batch, recent ones
        self.sampling_since: float | None = None  # the start of the batch it is sampling now
        self.learning_since = 0.0  # when the learner got its batch
        self.overlap = 0.0  # the share of the learner's last work during which the sampler sampled
        self.unpinned: tuple[set[int], int] | None = None  # the learner thread's affinity and torch's threads before
        self.handoff_s = 0.0  # the last hand-off's seconds: the wait for the sampler and the refresh

    # ---- the learner's side ----------------------------------------------------------------
    def start(self, step: int) -> None:
        """Batches step .. step + k ordered, all for the weights as they are now (version `step`)."""
        self.position = self.version = step
        self.sampled_through = step - 1
        self.failure = None
        self.orders.clear()
        self.ready.clear()
        self.drawn_before.clear()
        for j in range(step, step + self.k + 1):
            self._order(j)
        for j, batch in self.pending.items():  # sampled by older weights: trained as they are, not sampled again
            if j in self.orders:
                del self.orders[j]
                self.ready[j] = batch
        self.pending = {}
        first = step
        while first in self.ready:
            first += 1
        self.sampled_through = first - 1
        self.refresh()  # the sampler's weights are the policy's now, before either thread moves on
        self.run_id += 1
        if self.cores is not None:
            self.unpinned = os.sched_getaffinity(0), torch.get_num_threads()
            os.sched_setaffinity(0, self.cores.learner)  # this thread only (Linux: 0 is the calling thread)
            if self.cores.threads is not None:
                torch.set_num_threads(self.cores.threads)
        run = threading.Thread(target=self._run, args=(first, self.run_id), name="grpo-sampler", daemon=True)
        self.thread = run
        self.thread.start()

    def take(self, step: int) -> SampledBatch:
        """Batch `step`, once sampled; the sampler's failure, if it failed, is raised here."""
        if self.thread is None:
            self.start(step)
        self.learner_idle_s = 0.0
        with self.changed:
            waited = self._wait(lambda: step in self.ready)
            self.learner_idle_s += waited
            self.learning_since = time.perf_counter()
            batch = self.ready.pop(step)
        if not 0 <= batch.staleness() <= self.k:  # the fixed lag leaves nothing to drop: past it is a bug, not noise
            raise RuntimeError(f"batch {step} was sampled by the policy of step {batch.version}: past k={self.k}")
        return batch

    def publish(self, version: int) -> None:
        """The policy now has `version` (steps trained): the sampler's weights take it once the last
        batch of the previous version is sampled, and the batch `version + k` is ordered."""
        started = time.perf_counter()
        with self.changed:
            self.overlap = self._overlap(self.learning_since, started)
            last = min(version - 1 + self.k, self.steps - 1)  # the last batch the previous version samples
            self.learner_idle_s += self._wait(lambda: self.sampled_through >= last)
            self.refresh()
            self.handoff_s = time.perf_counter() - started
            self.version = version
            self.position = version
            self._order(version + self.k)
            self.changed.notify_all()

    def step_figures(self, step_s: float) -> dict[str, float]:
        """`async/*` of the step just trained (`step_s` its wall time): the share of it each side
        waited for the other, and `overlap`, the share of the learner's own work (scoring, update)
        during which the sampler was sampling: 1 when the two run side by side, 0 when one after the
        other, whatever the idle shares say."""
        with self.changed:
            sampler_idle, self.sampler_idle_s = self.sampler_idle_s, 0.0
        span = max(step_s, 1e-9)
        return {
            "async/learner_idle": min(self.learner_idle_s / span, 1.0),
            "async/sampler_idle": min(sampler_idle / span, 1.0),
            "async/overlap": self.overlap,
        }

    def _overlap(self, start: float, end: float) -> float:
        """The share of [start, end] the sampler spent sampling (called holding `changed`)."""
        spans = [*self.busy, *([(self.sampling_since, end)] if self.sampling_since is not None else [])]
        shared = sum(max(0.0, min(end, b) - max(start, a)) for a, b in spans)
        self.busy = [(a, b) for a, b in self.busy if b > start]  # older batches cannot meet later steps
        return min(shared / max(end - start, 1e-9), 1.0)

    def close(self, wait: bool = True) -> None:
        """Stop the sampler and give the learner's thread its cores back. `wait` for the batch it is
        sampling (the end of a job: it may be using the engine about to close); else let it go, its
        batch discarded (a rollback, whose save must not wait a generation: a cluster's grace is short)."""
        thread, self.thread = self.thread, None
        with self.changed:
            self.run_id += 1  # a thread let go finds it changed: it writes nothing more and stops
            self.changed.notify_all()
        if thread is not None and wait:
            thread.join()
        if self.unpinned is not None:  # the next job of a multirun starts as this one did
            os.sched_setaffinity(0, self.unpinned[0])
            torch.set_num_threads(self.unpinned[1])
            self.unpinned = None

    # ---- TrainState: the PromptSampler as of the learner's step -------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The PromptSampler's two integers as of the learner's step, and (`carry`) the batches
        sampled for the steps after it."""
        with self.changed:
            running = self.thread is not None
            state: dict[str, Any] = dict(self.drawn_before[self.position] if running else self.prompts.state_dict())
            sampled = [b for j, b in sorted(self.ready.items()) if j >= self.position] if running else []
            sampled = sampled or list(self.pending.values())
            if self.carry and all(b.rollout.environments is None for b in sampled):
                state["sampled"] = {"max_staleness": self.k, "settings": self.settings, "batches": sampled}
            return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A resume or a rollback: the prompts go back with the batches sampled ahead (kept when they
        were sampled at this k and these settings), and a running sampler is let go (the next `take`
        starts one again)."""
        self.close(wait=False)
        self.prompts.load_state_dict({"epoch": state["epoch"], "position": state["position"]})
        self.drawn_before.clear()
        sampled = state.get("sampled")  # absent: written by a synchronous run, or where batches cannot travel
        kept = sampled is not None and (sampled["max_staleness"], sampled["settings"]) == (self.k, self.settings)
        self.pending = {b.step: b for b in sampled["batches"]} if kept else {}

    # ---- the sampler's side --------------------------------------------------------------
    def _order(self, step: int) -> None:
        self.drawn_before[step] = self.prompts.state_dict()
        if step >= self.steps:  # past the run's end: nothing to sample, the state is kept for the save
            return
        for old in [j for j in self.drawn_before if j < self.position]:
            del self.drawn_before[old]
        self.orders[step] = self.prompts.next_batch(self.prompts_per_step)

    def _run(self, step: int, run_id: int) -> None:
        if self.cores is not None:
            os.sched_setaffinity(0, self.cores.sampler)
        try:
            while True:
                with self.changed:
                    waited = self._wait(lambda j=step: self.run_id != run_id or j in self.orders, sampler=True)
                    self.sampler_idle_s += waited
                    if self.run_id != run_id:  # closed: stop
                        return
                    examples, version = self.orders.pop(step), self.version
                    started = self.sampling_since = time.perf_counter()
                with torch.no_grad():
                    rollout = self.sample(step, examples)
                batch = SampledBatch(step, examples, rollout, version, time.perf_counter() - started)
                with self.changed:
                    if self.run_id != run_id:  # let go while sampling: the batch is no one's
                        return
                    self.busy.append((started, time.perf_counter()))
                    self.sampling_since = None
                    self.ready[step] = batch
                    self.sampled_through = step
                    self.changed.notify_all()
                step += 1
        except BaseException as err:  # noqa: BLE001 (re-raised on the learner's thread, whatever it is)
            with self.changed:
                if self.run_id == run_id:  # a thread let go fails on its own: nobody waits for it
                    self.failure = err
                    self.changed.notify_all()

    def _wait(self, done: Callable[[], bool], sampler: bool = False) -> float:
        """Wait (holding `changed`) until `done()`; the seconds waited. The learner's waits raise
        the sampler's failure instead of waiting for a batch that will never come."""
        started = time.perf_counter()
        while not done():
            if not sampler and self.failure is not None:
                failure, self.failure = self.failure, None
                self.thread = None
                raise failure
            if not sampler and (self.thread is None or not self.thread.is_alive()):
                raise RuntimeError("the sampler's thread stopped without a batch or an error")
            self.changed.wait(POLL_S)
        return time.perf_counter() - started
