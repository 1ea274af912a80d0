"""Weight updates, weight version and memory release/resume of the local engine.

Owns `WeightManager`. Every update loads tensors by Hugging Face name into the live model under the
scheduler's `model_lock` (so between decode steps), then sets the weight version to the request's
`weight_version` (unchanged when absent, as in SGLang). Sources:
- disk: every `*.safetensors` file of an HF checkpoint folder;
- distributed: a `WeightUpdateGroup` (see `slime.utils.weight_transport` for the rendezvous), one
  broadcast from rank 0 per tensor, in the order of `names`, or with `load_format`
  "flattened_bucket" one broadcast of all their bytes, tensor after tensor in that order;
- tensor: SGLang's `/update_weights_from_tensor` payload (`slime.utils.tensor_payload`: a
  flattened tensor bucket, or (name, tensor) pairs, pickled with torch's multiprocessing
  reductions, so CPU tensors arrive through shared memory and CUDA tensors as CUDA IPC handles);
  the engine decodes the entry of its own TP rank (0) with a restricted unpickler.
As SGLang, the engine fuses MLA's `q_a_proj` and `kv_a_proj_with_mqa` (`slime.models.fused`)
only from one update; where SGLang would silently drop a half that arrives without its partner,
this engine refuses the update, naming both tensors (`check_fused_sets`).
An engine serving a block-FP8 checkpoint takes (weight float8, weight_scale_inv) pairs by every
source and dequantises them (`local_engine.fp8`); a float tensor for an FP8 weight is refused.
Memory release and resume by tag live in `slime.backends.local_engine.memory` (`self.memory`);
updates are refused while the weights are released.

The engine speaks the newest supported SGLang release's protocol (`engine_protocol.NEWEST_RELEASE`,
reported as /server_info `version`), strictly: tensor and distributed updates are refused outside
a session opened by /begin_weight_update and closed by /end_weight_update, with SGLang 0.5.23's
messages (HTTP 400 `success: false`); a second begin or an end without begin is refused too.
"""

from __future__ import annotations

import glob
import logging
import os
import re

import torch

from slime.backends.local_engine.memory import EngineMemory
from slime.backends.local_engine.sampling import RequestError
from slime.models import fused_groups
from slime.models.fused import lone_members
from slime.utils.engine_protocol import NEWEST_RELEASE, PROTOCOLS
from slime.utils.tensor_payload import FLATTENED_BUCKET, decode_named_tensors, unpadded_layout, use_file_system_sharing
from slime.utils.weight_transport import init_weight_update_group

logger = logging.getLogger(__name__)

# Checkpoint names that transformers fuses on load (per-expert MoE weights -> one [E, ...] tensor):
# pattern -> (fused parameter name, function(expert, fused tensor) -> the view to copy into).
_FUSED_NAMES = {
    re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.gate_proj\.weight$"):
        (r"\1.gate_up_proj", lambda e, t: t[e, : t.shape[1] // 2]),
    re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.up_proj\.weight$"):
        (r"\1.gate_up_proj", lambda e, t: t[e, t.shape[1] // 2 :]),
    re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.down_proj\.weight$"): (r"\1.down_proj", lambda e, t: t[e]),
}


def loadable_tensors(model) -> dict:
    """Name -> tensor of everything a weight update may write: the parameters and the persistent
    buffers that checkpoints carry (e.g. DeepSeek-V3 / GLM-4.5's `mlp.gate.e_score_correction_bias`)."""
    persistent = model.state_dict(keep_vars=True)
    buffers = {name: buf for name, buf in model.named_buffers() if name in persistent}
    return {**buffers, **dict(model.named_parameters(remove_duplicate=False))}


def resolve_parameter(params: dict, name: str) -> torch.Tensor:
    """The tensor (a parameter or a view of a fused one) that HF checkpoint name `name` loads into.

    Raises `RequestError` if the served model has no such weight.
    """
    if name in params:
        return params[name]
    for pattern, (target, view) in _FUSED_NAMES.items():
        match = pattern.match(name)
        if match and match.expand(target) in params:
            fused = params[match.expand(target)]
            if int(match.group(2)) < fused.shape[0]:
                return view(int(match.group(2)), fused)
    raise RequestError(f"weight {name!r} is not a parameter of the served model")


def check_fused_sets(names, groups) -> None:
    """Raise `RequestError` naming each tensor that SGLang fuses with a partner absent from `names`."""
    lone = lone_members(names, groups)
    if lone:
        detail = "; ".join(f"{name} without {', '.join(missing)}" for name, missing in lone)
        raise RequestError(f"an update must carry every tensor SGLang fuses on load together "
                           f"(SGLang would silently drop the lone half): {detail}")


def announced_dtypes(names, dtypes) -> list[torch.dtype]:
    """The torch dtypes a distributed update announces ("bfloat16" or "torch.bfloat16"); RequestError
    naming the tensor for a name that is not one."""
    out = []
    for name, dtype in zip(names, dtypes):
        torch_dtype = getattr(torch, str(dtype).removeprefix("torch."), None)
        if not isinstance(torch_dtype, torch.dtype):
            raise RequestError(f"dtypes: {dtype!r} (for {name!r}) is not a torch dtype")
        out.append(torch_dtype)
    return out


class WeightManager:
    """Applies weight updates to `model` and tracks the weight version."""

    def __init__(self, model, scheduler, weight_version: str = "default", fp8=None) -> None:
        self.model, self.scheduler = model, scheduler
        self.fp8 = fp8  # `local_engine.fp8.Fp8Weights` when the served checkpoint is block FP8
        self.version = str(weight_version)
        self._groups: dict = {}
        config = getattr(model, "config", None)
        self.fused_groups = fused_groups(config.to_dict() if hasattr(config, "to_dict") else {})
        self.protocol = PROTOCOLS[NEWEST_RELEASE]
        self.session_open = False
        self.memory = EngineMemory(model, scheduler)
        use_file_system_sharing()  # CPU senders share by file name (see slime.utils.tensor_payload)

    def begin_session(self) -> None:
        """/begin_weight_update: open the session tensor and distributed updates need."""
        if self.session_open:
            raise RequestError("a weight-update session is already open; call end_weight_update() first")
        self.session_open = True

    def end_session(self) -> None:
        """/end_weight_update: close it (nothing to finalise: this engine loads weights as they come)."""
        if not self.session_open:
            raise RequestError("no weight-update session is open; call begin_weight_update() first")
        self.session_open = False

    def _check_session(self, endpoint: str) -> None:
        if self.protocol.needs_session(endpoint) and not self.session_open:
            raise RequestError(f"{endpoint} must run between begin_weight_update() and end_weight_update()")

    def _set_version(self, version) -> None:
        if version is not None:
            self.version = str(version)

    def load_named_tensors(self, named, weight_version=None) -> int:
        """Copy (name, tensor) pairs into the model's parameters (HF names, exact shapes).

        Raises `RequestError` for unknown names or shape mismatches; returns the count loaded.
        """
        if self.memory.weights_released:
            raise RequestError("weights are released; call /resume_memory_occupation before updating them")
        named = list(named)
        check_fused_sets([name for name, _ in named], self.fused_groups)
        if self.fp8 is not None:  # (weight fp8, weight_scale_inv) pairs -> dequantised weights
            named = self.fp8.dequantize_named(named)
        params = loadable_tensors(self.model)
        pairs = []
        for name, tensor in named:  # validate everything before touching the model
            target = resolve_parameter(params, name)
            if tuple(target.shape) != tuple(tensor.shape):
                raise RequestError(f"weight {name!r}: shape {tuple(tensor.shape)} != model {tuple(target.shape)}")
            pairs.append((target, tensor))
        with self.scheduler.model_lock, torch.no_grad():
            for target, tensor in pairs:
                target.copy_(tensor)
            self._set_version(weight_version)
        return len(pairs)

    def update_from_disk(self, model_path: str, load_format=None, weight_version=None) -> int:
        """Load every *.safetensors file of `model_path` (an HF checkpoint folder)."""
        from safetensors.torch import load_file

        files = sorted(glob.glob(os.path.join(str(model_path), "*.safetensors")))
        if not files:
            raise RequestError(f"model_path {model_path!r} has no *.safetensors files")
        named = [item for f in files for item in load_file(f).items()]
        return self.load_named_tensors(named, weight_version)

    def init_group(self, master_address, master_port, rank_offset, world_size, group_name, backend="nccl") -> None:
        """Join the trainer's group `group_name` as rank `rank_offset` (blocks until all joined)."""
        if group_name in self._groups:
            raise RequestError(f"weights update group {group_name!r} already exists")
        try:
            self._groups[group_name] = init_weight_update_group(
                master_address, int(master_port), int(rank_offset), int(world_size), group_name, backend)
        except Exception as exc:  # SGLang answers a failed join with 400 and this message
            raise RequestError(f"Failed to initialize custom process group: {exc}.") from exc

    def _plan_receive(self, names, dtypes: list[torch.dtype], shapes, device: str) -> tuple[list, RequestError | None]:
        """Per tensor (buffer to receive into, target to copy into or None); plus the first error.

        A tensor whose target parameter (or fused view) has the same dtype, shape and device and is
        contiguous is received straight into the model; others into a scratch buffer. On any
        error every buffer is scratch, so the broadcasts can be drained without touching the model.
        """
        params = loadable_tensors(self.model)
        plan, error = [], None
        try:
            check_fused_sets(names, self.fused_groups)
        except RequestError as exc:  # reported once the broadcasts were drained
            error = exc
        for name, torch_dtype, shape in zip(names, dtypes, shapes):
            target = None
            try:
                target = resolve_parameter(params, name)
                if tuple(target.shape) != tuple(shape):
                    raise RequestError(f"weight {name!r}: shape {tuple(shape)} != model {tuple(target.shape)}")
            except RequestError as exc:  # keep receiving so the sender's broadcasts complete
                error = error or exc
            direct = (target is not None and target.dtype == torch_dtype and target.is_contiguous()
                      and target.device.type == device)
            plan.append((target if direct else torch.empty(tuple(shape), dtype=torch_dtype, device=device), target))
        if error is not None or self.memory.weights_released:
            error = error or RequestError("weights are released; call /resume_memory_occupation before updating them")
            plan = [(torch.empty_like(buf) if buf is tgt else buf, None) for buf, tgt in plan]
        return plan, error

    def update_from_distributed(self, names, dtypes, shapes, group_name, weight_version=None,
                                load_format=None) -> int:
        """Receive each tensor by broadcast from rank 0 of `group_name` into the model (between
        steps); with `load_format` "flattened_bucket" one broadcast of all their bytes
        (`_receive_flattened`), any other value one broadcast per tensor, as SGLang.

        Bad names or shapes are reported (RequestError) only after all broadcasts were received,
        so the sender never hangs; the model is then unchanged.
        """
        self._check_session("update_weights_from_distributed")
        if group_name not in self._groups:
            raise RequestError(f"group_name {group_name!r} is not initialised (call /init_weights_update_group)")
        if not len(names) == len(dtypes) == len(shapes):
            raise RequestError("names, dtypes and shapes must have the same length")
        group = self._groups[group_name]
        device = "cuda" if group.device == "cuda" else "cpu"
        dtypes = announced_dtypes(names, dtypes)
        if load_format == FLATTENED_BUCKET:
            return self.load_named_tensors(self._receive_flattened(group, names, dtypes, shapes, device), weight_version)
        if self.fp8 is not None:  # received whole, then dequantised pairwise
            return self.load_named_tensors(self.fp8.receive(group, names, dtypes, shapes, device), weight_version)
        with self.scheduler.model_lock, torch.no_grad():
            plan, error = self._plan_receive(names, dtypes, shapes, device)
            for buffer, target in plan:
                group.broadcast(buffer, src=0)
                if target is not None and buffer is not target:
                    target.copy_(buffer)
            if error is not None:
                raise error
            self._set_version(weight_version)
        return len(plan)

    @staticmethod
    def _receive_flattened(group, names, dtypes: list[torch.dtype], shapes, device: str) -> list[tuple[str, torch.Tensor]]:
        """One broadcast of the tensors' bytes, each right after the previous one (SGLang's
        `FlattenedTensorBucket.empty`); a tensor whose start is not a multiple of its element size
        is refused after the broadcast was received (SGLang 0.5.23 refuses it before, leaving the
        sender waiting)."""
        ranges, total = unpadded_layout(dtypes, shapes)
        flattened = torch.empty(total, dtype=torch.uint8, device=device)
        group.broadcast(flattened, src=0)
        named = []
        for name, dtype, shape, (start, end) in zip(names, dtypes, shapes, ranges):
            if start % dtype.itemsize:
                raise RequestError(f"flattened bucket: {name!r} ({dtype}) starts at byte {start}, not a multiple "
                                   f"of its element size; send larger element sizes first")
            named.append((name, flattened[start:end].view(dtype).reshape(tuple(shape))))
        return named

    def destroy_group(self, group_name: str) -> None:
        """Destroy group `group_name` (its backend is shut down, as SGLang's destroy_process_group does)."""
        group = self._groups.pop(group_name, None)
        if group is None:
            raise RequestError(f"group_name {group_name!r} is not initialised")
        group.destroy()

    def update_from_tensor(self, serialized_named_tensors, load_format=None, weight_version=None) -> int:
        """Load SGLang's tensor payload: one entry per engine TP rank, this engine (TP 1) reads
        entry 0; `load_format` "flattened_bucket" or None (a list of (name, tensor) pairs)."""
        self._check_session("update_weights_from_tensor")
        if not isinstance(serialized_named_tensors, list) or not serialized_named_tensors:
            raise RequestError("serialized_named_tensors must be a non-empty list (one entry per TP rank)")
        try:
            named = decode_named_tensors(serialized_named_tensors[0], load_format)
        except ValueError as exc:
            raise RequestError(f"serialized_named_tensors[0]: {exc}") from exc
        return self.load_named_tensors(named, weight_version)

    # ---- memory (see memory.py) -------------------------------------------------------------
    def release(self, tags=None) -> None:
        """Release the memory of SGLang tags `tags` (None: all)."""
        self.memory.release(tags)

    def resume(self, tags=None) -> None:
        """Resume the memory of SGLang tags `tags` (None: all)."""
        self.memory.resume(tags)

    @property
    def released(self) -> bool:
        """True while any memory tag is released."""
        return bool(self.memory.released)
