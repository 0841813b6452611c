"""The server client of `rollout.vllm.mode=server` without vLLM: a stand-in for vLLM's endpoints
(/health, /collective_rpc, /reset_prefix_cache, /inference/v1/generate) on 127.0.0.1, whose weight
loads go through the worker extension's own pull (`vllm_worker.pulled_storage`, `tensor_views`).
A restarted server (its weights the model directory's again) is pushed to before it samples, and a
restart during sampling is sampled again; a hung server stops the call within call_timeout and a
stopped one after ready_timeout, each with one line naming the server and the call."""

from __future__ import annotations

import http.server
import json
import threading
import time
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpo_cli.config.generation_checks import validate_generation
from grpo_cli.config.schema import DataConfig, ModelConfig, RolloutConfig, TinyModelConfig, TrainConfig, VllmConfig
from grpo_cli.errors import GrpoError
from grpo_cli.models import build_tiny_model, load_tokenizer
from grpo_cli.rollout import make_generator
from grpo_cli.rollout.vllm_server import VLLMServerGenerator
from grpo_cli.rollout.vllm_worker import pulled_storage, tensor_views
from grpo_cli.rollout.weight_sync import engine_weights
from grpo_cli.training.pipeline import async_sampler

SAMPLED = [5, 6]  # what the stand-in samples before its stop token


class StandIn:
    """vLLM's endpoints as the client uses them; `log` lists the calls in order (load, generate)."""

    def __init__(self, port: int = 0) -> None:
        self.version: str | None = None  # the extension's: None as started (the model directory's weights)
        self.log: list[str] = []
        self.loaded: dict[str, torch.Tensor] = {}
        self.hang = 0.0  # seconds a generation sleeps before answering
        self.restart_while_sampling = False  # the next generation finds the weights reset after it
        stand_in = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                self.reply({} if self.path == "/health" else None)

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                self.reply(stand_in.answer(self.path, body))

            def reply(self, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(200 if payload is not None else 404)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, path: str, body: dict) -> Any:
        if path == "/reset_prefix_cache":
            return {"success": True}
        if path == "/collective_rpc" and body["method"] == "grpo_weights_version":
            return {"results": [self.version]}
        if path == "/collective_rpc" and body["method"] == "grpo_load_pushed_weights":
            return {"results": [self.load(json.loads(body["args"][0]))]}
        if path == "/inference/v1/generate":
            return self.generate(body["sampling_params"])
        return None

    def load(self, push: dict) -> dict:
        """As the extension: from the shared file, or pulled over HTTP from the trainer's listener."""
        if push["transfer"] == "http":
            storage = torch.frombuffer(pulled_storage(push["url"], push["nbytes"], 5.0), dtype=torch.uint8)
            storage = storage.untyped_storage()
        else:
            storage = torch.UntypedStorage.from_file(push["path"], shared=False, nbytes=push["nbytes"])
        self.loaded = {name: tensor.clone() for name, tensor in tensor_views(storage, push["layout"])}
        self.version = push["version"]
        self.log.append("load")
        return {"tensors": len(push["layout"]), "via": push["transfer"]}

    def generate(self, params: dict) -> dict:
        time.sleep(self.hang)
        if params["max_tokens"] > 1:  # not the start-up probe
            self.log.append("generate")
        if self.restart_while_sampling:
            self.restart_while_sampling, self.version = False, None
        stop = params["stop_token_ids"][0]
        content = [{"token_id": token, "logprob": -1.0} for token in SAMPLED]
        logprobs = None if params["logprobs"] is None else {"content": content}
        choice = {"token_ids": [*SAMPLED, stop], "finish_reason": "stop", "stop_reason": None, "logprobs": logprobs}
        return {"choices": [{"index": i, **choice} for i in range(params["n"])]}

    def restart(self) -> None:
        """What a restarted vLLM server holds: the model directory's weights, no version."""
        self.version = None

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Any]:
    model_dir = build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", TinyModelConfig(), seed=0)
    return AutoModelForCausalLM.from_pretrained(model_dir), load_tokenizer(model_dir)


@pytest.fixture
def stand_in() -> Any:
    server = StandIn()
    yield server
    server.stop()


def server_rollout(url: str, **vllm: Any) -> RolloutConfig:
    return RolloutConfig(backend="vllm", num_generations=2, vllm=VllmConfig(mode="server", server_url=url, **vllm))


def client(policy: tuple, cfg: RolloutConfig) -> VLLMServerGenerator:
    generator, line = make_generator(policy[0], policy[1], cfg)
    assert isinstance(generator, VLLMServerGenerator) and cfg.vllm.server_url in line
    return generator


def sample(generator: VLLMServerGenerator, tokenizer: Any) -> Any:
    encoded = tokenizer(["1+1="], return_tensors="pt")  # one prompt: one request per generation in the log
    return generator.generate(encoded["input_ids"], encoded["attention_mask"], 2)


def test_the_weights_reach_the_server_over_http_and_a_restart_is_pushed_to_before_sampling(policy, stand_in) -> None:
    generator = client(policy, server_rollout(stand_in.url, transfer="http"))
    try:
        rollout = sample(generator, policy[1])
        assert stand_in.log == ["load", "generate"]  # the first generation pushes (the server holds the disk's)
        expected = dict(engine_weights(policy[0]))
        assert stand_in.loaded.keys() == expected.keys()
        assert all(torch.equal(stand_in.loaded[name], tensor) for name, tensor in expected.items())
        assert rollout.completion_ids[:, :2].tolist() == [SAMPLED] * 2 and rollout.engine_logps is not None
        sample(generator, policy[1])
        assert stand_in.log == ["load", "generate", "generate"]  # nothing moved: no push
        stand_in.restart()
        sample(generator, policy[1])
        assert stand_in.log[3:] == ["load", "generate"] and generator.restarts == 1
        stand_in.restart_while_sampling = True
        sample(generator, policy[1])  # sampled by weights that were reset meanwhile: pushed and sampled again
        assert stand_in.log[5:] == ["generate", "load", "generate"] and generator.restarts == 2
    finally:
        generator.close()


def test_a_hung_server_stops_the_call_within_the_timeout(policy, stand_in) -> None:
    generator = client(policy, server_rollout(stand_in.url, call_timeout=0.5))
    stand_in.hang = 3.0
    start = time.monotonic()
    try:
        with pytest.raises(GrpoError) as hung:
            sample(generator, policy[1])
    finally:
        generator.close()
    message = str(hung.value)
    assert time.monotonic() - start < 2.5
    assert stand_in.url in message and "POST /inference/v1/generate" in message and "call_timeout=0.5s" in message
    assert "\n" not in message


def test_a_stopped_server_is_waited_for_and_named_when_it_stays_away(policy, stand_in) -> None:
    generator = client(policy, server_rollout(stand_in.url, ready_timeout=1.0))
    stand_in.stop()
    start = time.monotonic()
    try:
        with pytest.raises(GrpoError) as gone:
            sample(generator, policy[1])
    finally:
        generator.close()
    message = str(gone.value)
    assert 1.0 <= time.monotonic() - start < 4
    assert stand_in.url in message and "ready_timeout=1s" in message and "GET /health" in message, message
    assert "\n" not in message


def test_a_server_back_within_the_wait_is_pushed_to_and_sampled(policy, stand_in) -> None:
    generator = client(policy, server_rollout(stand_in.url, ready_timeout=10.0))
    try:
        sample(generator, policy[1])
        port = stand_in.server.server_address[1]
        stand_in.stop()
        back: list[StandIn] = []
        restarter = threading.Timer(1.0, lambda: back.append(StandIn(port)))  # a fresh server: no version
        restarter.start()
        rollout = sample(generator, policy[1])
        restarter.join()
        assert back[0].log == ["load", "generate"] and generator.restarts == 1  # waited, pushed, then sampled
        assert rollout.completion_ids.size(0) == 2
        back[0].stop()
    finally:
        generator.close()


def test_server_mode_needs_the_server_url() -> None:
    cfg = RolloutConfig(backend="vllm", vllm=VllmConfig(mode="server"))
    with pytest.raises(GrpoError, match="rollout.vllm.server_url"):
        validate_generation(ModelConfig(), DataConfig(), cfg)
    with pytest.raises(GrpoError, match="rollout.vllm.mode"):
        validate_generation(ModelConfig(), DataConfig(), RolloutConfig(vllm=VllmConfig(mode="remote")))


def test_the_server_is_waited_for_at_start_up_and_named(policy) -> None:
    stopped = r"127\.0\.0\.1:9: waiting for it at start-up; GET /health .*ready_timeout=0\.5s"
    with pytest.raises(GrpoError, match=stopped):
        make_generator(policy[0], policy[1], server_rollout("http://127.0.0.1:9", ready_timeout=0.5))


def test_the_pipelines_hand_off_push_waits_for_a_server_and_names_one_that_stays_away(policy, stand_in) -> None:
    """rollout.max_staleness: the learner's hand-off pushes outside any generation (async_sampler's
    refresh). A server back within the wait gets the push; one that stays away stops the run with
    one line naming it, not a traceback."""
    cfg = TrainConfig()
    cfg.rollout = server_rollout(stand_in.url, ready_timeout=10.0)
    cfg.rollout.max_staleness = 1
    generator = client(policy, cfg.rollout)
    side = async_sampler(policy[0], policy[1], generator, cfg, context=None)
    try:
        side.refresh()  # version 0's push
        port = stand_in.server.server_address[1]
        stand_in.stop()
        back: list[StandIn] = []
        restarter = threading.Timer(1.0, lambda: back.append(StandIn(port)))
        restarter.start()
        side.refresh()  # version 1's, while the server is away
        restarter.join()
        assert back[0].log == ["load"] and back[0].version == generator.expected_version
        back[0].stop()
        generator.server.ready_timeout = 1.0
        with pytest.raises(GrpoError) as gone:
            side.refresh()
        assert stand_in.url in str(gone.value) and "\n" not in str(gone.value)
    finally:
        generator.close()
