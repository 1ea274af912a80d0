"""The local engine object: model + tokenizer + scheduler + weight manager, and /generate parsing.

Owns `EngineConfig` (the server flags), `Engine` (loads the HF model, starts the scheduler) and
`parse_generate` (turns SGLang's `GenerateReqInput` JSON into `Request`s). SGLang's router
forwards its whole field set with defaults filled in, so unknown top-level fields are accepted and
ignored; fields asking for features this engine does not provide (streaming, hidden states,
multimodal data, LoRA, top-logprobs, ...) are rejected when set to a non-default value.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid

import torch

from slime.backends.local_engine.sampling import RequestError, parse_sampling_params
from slime.backends.local_engine.scheduler import Request, Scheduler
from slime.backends.local_engine.fp8 import load_causal_lm
from slime.backends.local_engine.weights import WeightManager, resolve_parameter

logger = logging.getLogger(__name__)

# SGLang GenerateReqInput fields whose non-default values need features the engine lacks.
_UNSUPPORTED_IF_SET = (
    "stream", "return_hidden_states", "return_entropy", "return_bytes",
    "background", "image_data", "video_data", "audio_data", "input_embeds", "lora_path", "lora_id",
    "top_logprobs_num", "token_ids_logprob", "session_params", "custom_logit_processor",
)
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclasses.dataclass
class EngineConfig:
    """Server flags (see `__main__.py` for their help)."""

    model_path: str
    host: str = "127.0.0.1"
    port: int = 30000
    dtype: str = "float32"
    device: str = "cpu"
    max_running_requests: int = 64
    context_length: int | None = None
    random_seed: int = 0
    weight_version: str = "default"
    num_threads: int | None = None


class Engine:
    """Loaded model and its serving machinery; `start()` launches the scheduler thread."""

    def __init__(self, config: EngineConfig) -> None:
        from transformers import AutoTokenizer

        if config.dtype not in _DTYPES:
            raise ValueError(f"--dtype {config.dtype!r} is not one of {sorted(_DTYPES)}")
        self.config = config
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        torch.manual_seed(config.random_seed)
        self.tokenizer = AutoTokenizer.from_pretrained(config.model_path)
        self.model, fp8 = load_causal_lm(config.model_path, _DTYPES[config.dtype], resolve_parameter)
        self.model.to(config.device).eval()
        model_max = getattr(self.model.config, "max_position_embeddings", None) or 4096
        self.context_length = config.context_length or model_max
        self.vocab_size = self.model.get_input_embeddings().weight.shape[0]
        self.scheduler = Scheduler(self.model, self.tokenizer, context_length=self.context_length,
                                   max_running=config.max_running_requests, random_seed=config.random_seed,
                                   weight_version=lambda: self.weights.version)
        self.weights = WeightManager(self.model, self.scheduler, config.weight_version, fp8=fp8)

    def start(self) -> None:
        """Start the scheduler loop."""
        self.scheduler.start()

    def stop(self) -> None:
        """Abort everything and stop the scheduler loop."""
        self.scheduler.stop()

    def model_info(self) -> dict:
        """The body of GET /get_model_info."""
        return {"model_path": self.config.model_path, "tokenizer_path": self.config.model_path,
                "is_generation": True, "weight_version": self.weights.version,
                "architectures": list(getattr(self.model.config, "architectures", None) or [])}

    def server_info(self) -> dict:
        """The body of GET /get_server_info: server args plus live state; `version` is the SGLang
        release whose protocol this engine speaks (the newest supported one)."""
        return {**dataclasses.asdict(self.config), "context_length": self.context_length,
                "engine": "slime.local_engine", "version": self.weights.protocol.release,
                "weight_version": self.weights.version,
                "paused": self.scheduler.paused, "released": self.weights.released,
                "memory_occupation": self.weights.memory.occupation(), **self.scheduler.load()}

    def _prompts(self, body: dict) -> tuple[list[list[int]], bool]:
        has_ids, has_text = body.get("input_ids") is not None, body.get("text") is not None
        if has_ids == has_text:
            raise RequestError("exactly one of input_ids and text must be given")
        if has_text:
            text = body["text"]
            if isinstance(text, str):
                return [self.tokenizer.encode(text)], False
            if isinstance(text, list) and text and all(isinstance(t, str) for t in text):
                return [self.tokenizer.encode(t) for t in text], True
            raise RequestError("text must be a string or a non-empty list of strings")
        ids = body["input_ids"]
        batch = isinstance(ids, list) and bool(ids) and isinstance(ids[0], list)
        prompts = ids if batch else [ids]
        for prompt in prompts:
            if not isinstance(prompt, list) or not prompt:
                raise RequestError("input_ids must be a non-empty list of token ids (or a list of such lists)")
            if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < self.vocab_size for t in prompt):
                raise RequestError(f"input_ids must be integers in [0, {self.vocab_size})")
        return prompts, batch

    def _routed_experts_options(self, body: dict, prompts: list[list[int]]) -> dict:
        """`return_routed_experts` / `routed_experts_start_len` (SGLang: start in [0, prompt length])."""
        wanted = bool(body.get("return_routed_experts"))
        start = body.get("routed_experts_start_len") or 0
        if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start <= min(len(p) for p in prompts):
            raise RequestError(f"routed_experts_start_len must be an integer in [0, prompt length], got {start!r}")
        if wanted and not self.scheduler.routing.supported:
            raise RequestError("return_routed_experts needs a mixture-of-experts model; this one has no routers")
        return {"return_routed_experts": wanted, "routed_experts_start_len": start}

    def parse_generate(self, body, on_done_factory) -> tuple[list[Request], bool]:
        """Validate a /generate body; returns (requests, is_batch). Raises `RequestError`.

        `on_done_factory(index)` gives the callback for the index-th request of the batch.
        """
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        for name in _UNSUPPORTED_IF_SET:
            if body.get(name):
                raise RequestError(f"{name}={body[name]!r} is not supported by the local engine")
        prompts, batch = self._prompts(body)
        raw_params = body.get("sampling_params")
        if isinstance(raw_params, list):
            if len(raw_params) != len(prompts):
                raise RequestError("sampling_params list must have one entry per prompt")
        else:
            raw_params = [raw_params] * len(prompts)
        rids = body.get("rid")
        if rids is None:  # one random id per body (os.urandom is a system call), suffixed per prompt
            rids = uuid.uuid4().hex
        if isinstance(rids, str):
            rids = [rids] if not batch else [f"{rids}_{i}" for i in range(len(prompts))]
        if not isinstance(rids, list) or len(rids) != len(prompts):
            raise RequestError("rid must be a string or a list with one entry per prompt")
        start = body.get("logprob_start_len")
        start = -1 if start is None else start
        if isinstance(start, bool) or not isinstance(start, int) or start < -1:
            raise RequestError(f"logprob_start_len must be an integer >= -1, got {start!r}")
        if start >= min(len(p) for p in prompts):
            raise RequestError(f"logprob_start_len ({start}) must be smaller than the prompt length")
        routed = self._routed_experts_options(body, prompts)
        requests = [
            Request(rid=str(rid), prompt_ids=list(prompt), logprob_start_len=start,
                    params=parse_sampling_params(raw, len(prompt), self.context_length),
                    on_done=on_done_factory(i), return_logprob=bool(body.get("return_logprob")),
                    return_text_in_logprobs=bool(body.get("return_text_in_logprobs")), **routed)
            for i, (prompt, raw, rid) in enumerate(zip(prompts, raw_params, rids))
        ]
        return requests, batch
