"""credo credit in verl's PPO loop (verl 0.9.x, legacy RayPPOTrainer path: trainer.use_v1=false).

    python -m credo.integrations.verl_ppo trainer.use_v1=false \
        algorithm.adv_estimator=credo:rredcot +credo.task=gym:chain_sum ...   (verl's ppo_trainer config)

`algorithm.adv_estimator=credo:<name>` selects any credo estimator; `+credo.{task,task_options,
credit,seed}` give its task and options. Other adv_estimator values run verl unchanged.

How it is wired (verl 0.9.1 has no hook for token-aware estimators; RFC verl#7735 asks for one):
  * CredoActorRolloutRefWorker = CredoCreditWorkerMixin + verl's ActorRolloutRefWorker: the credit runs
    where the actor lives, on each data-parallel rank (verl_worker.py).
  * CredoRayPPOTrainer.fit swaps ray_trainer's module-level `compute_advantage` (which fit calls on the
    driver) for one that sends credo:<name> batches to the workers via credit_on_shards and forwards every
    other estimator to verl's own function; the original is restored when fit returns.
  * CredoTaskRunner builds that worker and trainer in place of verl's.
Needs verl's full GPU stack (ray actors, FSDP, vLLM/SGLang); it is not importable on the CPU test machine.
"""

from __future__ import annotations

from typing import Any

import ray
from verl.trainer import main_ppo_v0
from verl.trainer.ppo import ray_trainer
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.workers.engine_workers import ActorRolloutRefWorker

from credo.integrations.verl_credit import PREFIX, credit_on_shards, credo_spec
from credo.integrations.verl_worker import CredoCreditWorkerMixin

class CredoActorRolloutRefWorker(CredoCreditWorkerMixin, ActorRolloutRefWorker):
    """verl's hybrid actor/rollout/ref worker plus `credo_compute_advantage`."""


class CredoRayPPOTrainer(RayPPOTrainer):
    """RayPPOTrainer whose advantage step runs credo's estimator on the actor workers for credo:<name>."""

    def fit(self) -> Any:
        spec = credo_spec(self.config)
        if spec is None:
            return super().fit()
        from credo import credit as credit_registry
        credit_registry.get(spec["estimator"])  # an unknown name fails here, before any rollout
        verl_compute_advantage = ray_trainer.compute_advantage

        def compute_advantage(data: Any, adv_estimator: Any, *args: Any, **kwargs: Any) -> Any:
            if str(adv_estimator) != PREFIX + spec["estimator"]:
                return verl_compute_advantage(data, adv_estimator, *args, **kwargs)
            shards = self._get_dp_size(self.actor_rollout_wg, "actor")
            step_spec = {**spec, "seed": spec["seed"] * 1_000_003 + int(self.global_steps),  # draws differ by step
                         "step": int(self.global_steps)}  # named by the credit checks' errors
            return credit_on_shards(data, step_spec, self.actor_rollout_wg.credo_compute_advantage, shards)

        ray_trainer.compute_advantage = compute_advantage
        try:
            return super().fit()
        finally:
            ray_trainer.compute_advantage = verl_compute_advantage


class CredoTaskRunner(main_ppo_v0.TaskRunner.__ray_actor_class__):  # type: ignore[name-defined]
    """verl's TaskRunner with credo's worker and trainer."""

    def add_actor_rollout_worker(self, config: Any) -> Any:
        actor_cls, group_cls = super().add_actor_rollout_worker(config)
        for role, remote_cls in list(self.role_worker_mapping.items()):
            if remote_cls.__ray_actor_class__ is actor_cls:
                self.role_worker_mapping[role] = ray.remote(CredoActorRolloutRefWorker)
        return CredoActorRolloutRefWorker, group_cls

    def run(self, config: Any) -> Any:
        from credo.integrations.verl import register_with_verl
        register_with_verl()  # credo_grpo | credo_dr_grpo | credo_rloo, in the process that computes advantages
        main_ppo_v0.RayPPOTrainer = CredoRayPPOTrainer  # run() names the trainer class as a module global
        return super().run(config)


def main() -> None:
    """verl's main_ppo entry (its ppo_trainer config by default) with credo's task runner."""
    import os

    import hydra
    import verl.trainer
    from verl.trainer.main_ppo import run_ppo

    @hydra.main(config_path=os.path.join(os.path.dirname(verl.trainer.__file__), "config"),
                config_name="ppo_trainer", version_base=None)
    def entry(config: Any) -> None:
        if config.trainer.get("use_v1", False):
            raise SystemExit("credo's verl path runs the RayPPOTrainer loop: add trainer.use_v1=false")
        run_ppo(config, task_runner_class=ray.remote(num_cpus=1)(CredoTaskRunner))

    entry()


if __name__ == "__main__":
    main()
