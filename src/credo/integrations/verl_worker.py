"""The worker side of credo credit in verl: a mixin for verl's actor worker, registered with its dispatch.

`CredoCreditWorkerMixin.credo_compute_advantage(data)` runs on every actor rank (verl's nd data-parallel
dispatch over the "actor" mesh, the same as `compute_log_prob`: each DP rank gets one contiguous chunk,
tensor-parallel ranks get copies, only the collecting ranks' outputs come back). It scores with a plain,
unsharded Hugging Face copy of the actor, built once from the actor's model config and refreshed every
call from `engine.get_per_tensor_param()` (the full HF-named weights verl streams to its rollout engine):
the estimators' probes run a data-dependent number of forwards per rank, which a sharded FSDP/Megatron
module cannot do (every forward is a collective there). The copy costs one model of memory per rank,
in the actor's dtype. Batch-wide statistics cross the DP group by Probe.gather (shards.py).

Only this module's imports are light (verl's protocol and decorator modules, CPU-importable); the
concrete worker and trainer classes that need verl's full GPU stack live in credo.integrations.verl_ppo.
"""

from __future__ import annotations

from typing import Any

import torch
from verl import DataProto
from verl.single_controller.base.decorator import make_nd_compute_dataproto_dispatch_fn, register

from credo.integrations.shards import process_group_gather
from credo.integrations.verl_credit import apply_credit


class CredoCreditWorkerMixin:
    """Mix into verl's ActorRolloutRefWorker (before it in the bases) to give it `credo_compute_advantage`."""

    credo_module_dtype: torch.dtype = torch.bfloat16  # the scoring copy's dtype
    _credo_module: torch.nn.Module | None = None
    _credo_tasks: dict | None = None
    _credo_synced_once: bool = False

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def credo_compute_advantage(self, data: DataProto) -> DataProto:
        """data: one DP shard holding whole groups (credit_on_shards arranges that), meta_info["credo"] the
        spec. Returns advantages, returns [B, R] and credo_cost [B, 2] (row 0: this shard's tokens)."""
        spec = data.meta_info["credo"]
        module = self._credo_synced_module()
        engine = self.actor.engine
        out = apply_credit(data, spec["estimator"], module=module, tokenizer=self.actor.model_config.tokenizer,
                           task=self._credo_task(spec), config=spec.get("credit"),
                           gather=process_group_gather(engine.get_data_parallel_group()),
                           seed=int(spec.get("seed", 0)),  # one seed on every shard: group-seeded draws match 1 shard
                           step=spec.get("step"), checks=bool(spec.get("checks", True)),
                           leak_check=bool(spec.get("leak_check", False)))
        result = out.select(batch_keys=["advantages", "returns", "credo_cost"], non_tensor_batch_keys=[],
                            meta_info_keys=[])
        return result.to("cpu")

    def _credo_task(self, spec: dict[str, Any]) -> Any:
        from credo.tasks import make_task
        key = (spec["task"], repr(sorted((spec.get("task_options") or {}).items())))
        self._credo_tasks = self._credo_tasks or {}
        if key not in self._credo_tasks:
            self._credo_tasks[key] = make_task(spec["task"], dict(spec.get("task_options") or {}))
        return self._credo_tasks[key]

    def _credo_synced_module(self) -> torch.nn.Module:
        """An unsharded HF copy of the actor with this step's weights (a collective: all ranks call it)."""
        engine = self.actor.engine
        params, peft_config = engine.get_per_tensor_param()
        if peft_config is not None:
            raise NotImplementedError("credo credit on a LoRA actor in verl: not supported yet (the streamed "
                                      "weights are adapters); train without actor_rollout_ref.model.lora_rank")
        if self._credo_module is None:
            from transformers import AutoModelForCausalLM

            from credo.policy.device import dtype_argument
            hf_config = self.actor.model_config.hf_config
            device = torch.device("cuda",
                                  torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
            with torch.device(device):
                self._credo_module = AutoModelForCausalLM.from_config(
                    hf_config, **dtype_argument(self.credo_module_dtype))
            self._credo_module.eval().requires_grad_(False)
        state = self._credo_module.state_dict()
        updated = set()
        for name, tensor in params:
            if name in state:
                state[name].copy_(tensor.to(state[name].device, state[name].dtype))
                updated.add(name)
        if not self._credo_synced_once:  # a naming mismatch would leave random weights scoring the credit
            _check_all_synced(self._credo_module, updated)
            self._credo_synced_once = True
        return self._credo_module


def _check_all_synced(module: torch.nn.Module, updated: set[str]) -> None:
    """Every parameter of the scoring copy must have come from the engine's weight stream: a name that did not
    match (a prefix, an unfused layer) would leave the copy's random initialisation scoring the credit. A
    parameter tied to one that was updated (tied embeddings) shares its storage and counts as updated."""
    updated_storage = {p.data_ptr() for n, p in module.named_parameters() if n in updated}
    missed = [n for n, p in module.named_parameters(remove_duplicate=False)
              if n not in updated and p.data_ptr() not in updated_storage]
    if missed:
        raise RuntimeError(f"credo's scoring copy of the actor got no streamed weights for {len(missed)} parameter(s) "
                           f"(e.g. {missed[:3]}): the engine's parameter names do not match the HF model's")
