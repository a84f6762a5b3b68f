"""The RL trainer: sample groups, reward, credit, clipped-surrogate updates; resumable run directories.

One step (`Trainer.train_step`), in order:
  1. the strategy draws prompts and samples G completions each, rewarded by the task's verifier
     (plain, DAPO dynamic sampling or RRPO/SRPO resets: credo.strategies);
  2. DAPO's overlong penalty shapes the rewards;
  3. old (and reference) log-probs from one no-grad scoring pass;
  4. credit from the named estimator, through a counted Probe;
  5. `epochs` passes of `minibatches` AdamW steps on the clipped surrogate.
`Trainer.train` is the loop around it: evaluate when due, log, checkpoint.
A run directory holds config.yaml, metrics.jsonl, checkpoints/step-N (atomic) and final/.
`--resume RUN_DIR` restarts from the last checkpoint with every random stream restored, so a resumed
run on CPU ends with the same metrics as one that was never interrupted.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from dataclasses import replace
from typing import Any, Callable

import torch
from tqdm import tqdm

from credo import credit as credit_registry
from credo import strategies
from credo.core.config import ConfigError, UserError, dump_yaml, to_dict
from credo.train.distributed import DataParallel, Sharded
from credo.train.evaluate import evaluate
from credo.integrations.tracking import TrackingPlace, check_installed, closing_trackers, open_trackers
from credo.core.loss import policy_loss
from credo.policy import bind_task, check_policy_path, load_policy
from credo.train.starts import NAMED_START, named_start
from credo.policy.base import Policy
from credo.policy.device import device_name, resolve_device, resolve_dtype
from credo.train.provenance import loaded_commit
from credo.core.probe import Probe
from credo.core.rollouts import Credit, Rollouts
from credo.train.resume_checks import check_restartable, check_resumable, update_config_yaml
from credo.core.files import KIND_MARKER, MetricsLog, NullLog, atomic_directory, atomic_write_text, last_checkpoint, run_lock
from credo.core.state_io import (CorruptStateError, check_safetensors, load_state, optimizer_state, optimizer_state_dict, save_state,
                            verify_manifest, write_manifest)
from credo.strategies import Collected, SamplingContext, Strategy
from credo.train.streams import RandomStreams
from credo.train.eta import format_seconds, seconds_left, steps_ahead
from credo.train.config import (TrainConfig, config_from_run, load_train_config,  # noqa: F401  (re-exported)
                                fitted_overlong_buffer, overlong_penalty, strategy_options)
from credo.tasks import make_task


class Trainer:
    """GRPO-family trainer over any Policy backend. Subclass and override a phase to try an idea. tracking: where
    the trackers of `config.report_to` write (default: in run_dir; credo.integrations.tracking)."""

    def __init__(self, config: TrainConfig, run_dir: str, policy: Policy | None = None, progress: bool = True,
                 on_step: Callable[["Trainer", dict], None] | None = None,
                 accept_unrecorded_checkpoint: bool = False, tracking: TrackingPlace | None = None) -> None:
        self.config, self.run_dir, self.progress, self.on_step = config, run_dir, progress, on_step
        self.accept_unrecorded_checkpoint = accept_unrecorded_checkpoint  # resume_checks.check_resumable
        check_installed(config.report_to, "train.report_to")  # before a model loads or --out is touched
        self.tracking, self.trackers = tracking or TrackingPlace.for_run(run_dir), None  # opened by begin()
        loaded_commit()  # summary.json's credo_commit, read while what is on disk is the code this process loaded
        self.task = make_task(config.task, config.task_options, prefix="train.task_options.")
        self.estimator = credit_registry.get(config.estimator)  # resolved and its options checked at load
        self.credit_config = config.credit
        if policy is None:
            device = resolve_device(config.device, "train.device")  # before the start is read: one line, exit 2
            dtype = resolve_dtype(config.dtype, device, "train.dtype")
            policy = load_policy(self.start_path(), device=device, lora_r=config.lora_r, lora_alpha=config.lora_alpha,
                                 lora_targets=config.lora_targets, dtype=dtype)
        # config.yaml records the device the run trains on ('auto' resolved), so that a resume or a comparison
        # reusing the run continues on it, and moving it elsewhere is asked for explicitly (docs/gpu.md)
        self.config = config = replace(config, device=device_name(policy.device))
        self.policy = bind_task(policy, self.task, "train.start", config.sampling.max_new_tokens)  # now, not mid-run
        self.reference = self.policy.copy() if config.loss.kl_coef > 0 else None
        self.optimizer = torch.optim.AdamW([p for p in self.policy.model.parameters() if p.requires_grad], lr=config.lr,
                                           betas=(config.beta1, config.beta2), weight_decay=config.weight_decay)
        self.streams = RandomStreams.seeded(config.seed)
        self.step, self.tokens_generated, self.tokens_scored, self.seconds = 0, 0, 0, 0.0
        self.log = MetricsLog(os.path.join(run_dir, "metrics.jsonl"))
        self.dp = self.data_parallel()
        # batch-wide statistics (RREDCoT's z, SC-GRPO's quantile) over every rank's rows, as one process sees them
        gather = None
        if self.dp is not None and self.dp.world > 1:
            from credo.integrations.shards import process_group_gather
            gather = process_group_gather()
        self.probe = Probe(self.policy, self.task, config.sampling, self.streams.probe, gather=gather)
        self.strategy: Strategy = strategies.make(config.strategy, strategy_options(config))
        self.overlong_buffer, self.longest_solution = fitted_overlong_buffer(config, self.task, self.policy)
        if self.dp is not None:
            self.strategy = Sharded(self.strategy, self.dp, config.seed)

    def start_path(self) -> str:
        if self.config.start.startswith(NAMED_START):
            return named_start(self.config.start, "train.start", self.config.task, self.progress)
        if self.config.start:  # checked first: load_policy's error would not name the field
            return check_policy_path(self.config.start, "train.start")
        from credo.train.sft import ensure_sft
        return ensure_sft(progress=self.progress, task=self.config.task)

    def data_parallel(self) -> DataParallel | None:
        """The process group of a data-parallel launch (None when the run is not data-parallel)."""
        if not self.config.data_parallel:
            return None
        dp, prompts = DataParallel(), self.config.prompts_per_step
        if prompts % dp.world:
            raise ConfigError(f"train.prompts_per_step={prompts} must be divisible by the {dp.world} data-parallel processes")
        return dp

    @property
    def on_policy(self) -> bool:
        """One epoch of one mini-batch: a single update, by the policy that sampled the batch."""
        return self.config.epochs == 1 and self.config.minibatches == 1

    @property
    def is_main(self) -> bool:
        return self.dp is None or self.dp.is_main

    # --- one step, phase by phase (the module docstring's order) ---------------------------------------
    def train_step(self) -> dict[str, Any]:
        """One optimisation step; returns its metrics row."""
        started = time.time()
        collected = self.collect()                   # 1. prompts, G completions each, the verifier's rewards
        rollouts = self.prepare(collected)           # 2-3. shaped rewards, old and reference log-probs
        credit = self.assign_credit(rollouts)        # 4. the estimator's credit (its Probe cost metered)
        update_stats = self.update(rollouts, credit)  # 5. epochs x minibatches AdamW steps
        self.step += 1
        return self.record(collected, rollouts, credit, update_stats, time.time() - started)

    def sampling_context(self) -> SamplingContext:
        c = self.config
        return SamplingContext(self.policy, self.task, self.draw_problems, c.sampling, self.streams.sample, self.probe,
                               self.streams.reset, c.group_size, self.step)

    def draw_problems(self, n: int) -> list:
        return self.task.train_problems(n, self.streams.problem)

    def collect(self) -> Collected:
        return self.strategy.collect(self.sampling_context(), self.config.prompts_per_step)

    @torch.no_grad()
    def prepare(self, collected: Collected) -> Rollouts:
        """Shaped rewards, exact old log-probs (same forward as training) and reference log-probs."""
        c, rollouts = self.config, collected.rollouts
        rewards = rollouts.rewards + overlong_penalty(rollouts.lengths, c.sampling.max_new_tokens, self.overlong_buffer, c.overlong_penalty)
        args = (rollouts.prompt_ids, rollouts.prompt_mask, rollouts.completion_ids, rollouts.completion_mask)
        # one epoch of one mini-batch updates the very policy that sampled: the update reads its own log-probs,
        # detached, as the old ones (ratio exactly 1, as TRL does with num_iterations=1), so this forward is
        # skipped when the rows already carry the sampler's log-probs (estimators such as SPO's cutpoints read them)
        skip = self.on_policy and collected.sampled_logprobs
        old = rollouts.old_logprobs if skip else self.policy.score(*args)[0]
        ref = self.reference.score(*args)[0] if self.reference is not None else None
        return rollouts.with_fields(rewards=rewards, old_logprobs=old, ref_logprobs=ref)

    def assign_credit(self, rollouts: Rollouts) -> Credit:
        return self.estimator(rollouts, self.probe, self.credit_config)

    def update(self, rollouts: Rollouts, credit: Credit) -> dict[str, float]:
        c = self.config
        mask = rollouts.trainable_mask()
        if credit.loss_mask is not None:
            mask = mask & credit.loss_mask
        B = rollouts.batch_size
        # data parallel: token-mean divides by the *global* token count, so the ranks' average is the global loss
        scale = 1.0
        if self.dp is not None and c.loss.aggregation == "token-mean":
            local = float(mask.sum())
            scale = local * self.dp.world / max(self.dp.sum(local), 1.0)
        stats: dict[str, float] = {"loss": 0.0, "clip_frac": 0.0, "kl": 0.0, "grad_norm": 0.0}
        n_updates = 0
        self.policy.model.train()
        for _ in range(c.epochs):
            order = list(range(B))
            self.streams.minibatch.shuffle(order)
            for chunk in range(c.minibatches):
                idx = torch.tensor(order[chunk::c.minibatches], dtype=torch.long)
                if idx.numel() == 0:
                    continue
                mb = rollouts.select(idx)
                logprobs, _ = self.policy.score(mb.prompt_ids, mb.prompt_mask, mb.completion_ids, mb.completion_mask)
                old = logprobs.detach() if self.on_policy else mb.old_logprobs
                loss, s = policy_loss(logprobs, old, credit.advantages[idx], mask[idx], c.loss,
                                      norm_length=c.sampling.max_new_tokens,
                                      weights=credit.weights[idx] if credit.weights is not None else None,
                                      ref_logprobs=mb.ref_logprobs)
                self.optimizer.zero_grad(set_to_none=True)
                (loss * scale).backward()
                trainable = [p for p in self.policy.model.parameters() if p.requires_grad]
                if self.dp is not None:
                    self.dp.average_gradients(trainable)
                grad_norm = torch.nn.utils.clip_grad_norm_(trainable, c.grad_clip)
                self.check_finite(loss, grad_norm)
                self.optimizer.step()
                stats["loss"] += float(loss.detach())
                stats["clip_frac"] += s["clip_frac"]
                stats["kl"] += s["kl"]
                stats["grad_norm"] += float(grad_norm)
                n_updates += 1
        return {k: v / max(n_updates, 1) for k, v in stats.items()}

    def check_finite(self, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        """Stop before a non-finite update reaches the weights; the last checkpoint stays the last good one."""
        for what, value in (("loss", loss), ("gradient norm", grad_norm)):
            if not bool(torch.isfinite(value.detach())):
                last = self.last_checkpoint()
                raise TrainingDiverged(
                    f"step {self.step + 1}: non-finite {what} ({float(value.detach()):g}); stopped before updating the weights. "
                    f"Last good checkpoint: {last or 'none (the run never checkpointed)'}. Lower train.lr or "
                    "check the rewards, then --resume or start again with --force")

    def record(self, collected: Collected, rollouts: Rollouts, credit: Credit, update_stats: dict[str, float],
               seconds: float) -> dict[str, Any]:
        """Count the step's tokens into the run's totals and return its metrics row (global when data-parallel)."""
        spent = credit.cost + collected.cost  # the estimator's and the strategy's (localisers') Probe work
        credit_generated, credit_scored = spent.tokens_generated, spent.tokens_scored
        if self.dp is not None:  # collected.tokens_generated is already global
            credit_generated, credit_scored = int(self.dp.sum(credit_generated)), int(self.dp.sum(credit_scored))
        self.tokens_generated += collected.tokens_generated + credit_generated
        self.tokens_scored += credit_scored
        self.seconds += seconds
        mask = rollouts.completion_mask
        row = {
            "step": self.step, "tokens_generated": self.tokens_generated, "tokens_scored": self.tokens_scored,
            "seconds": round(self.seconds, 3), "reward_mean": float(rollouts.rewards.mean()),
            "train_accuracy": float(rollouts.correct.float().mean()),
            "completion_length": float(mask.sum(1).float().mean()),
            "advantage_abs_mean": float((credit.advantages.abs() * mask).sum() / mask.sum().clamp(min=1)),
            **{k: round(v, 6) for k, v in collected.info.items()},
            **update_stats,
            **{f"credit_{k}": v for k, v in credit.info.items()},
        }
        if self.dp is not None:  # equal shards: the mean of the ranks' means is the global mean
            for key in ("reward_mean", "train_accuracy", "completion_length", "advantage_abs_mean", "loss", "clip_frac", "kl"):
                row[key] = self.dp.mean(row[key])
        return row

    # --- the loop -------------------------------------------------------------------------------------
    def train(self, stop_after: int | None = None) -> dict[str, Any]:
        """Run until the step/token budget is spent (or `stop_after` steps in this call, for tests). The main
        process holds the run directory's lock meanwhile (credo.core.files.run_lock)."""
        with run_lock(self.run_dir) if self.is_main else contextlib.nullcontext(), closing_trackers(self):
            return self._train(stop_after)

    def _train(self, stop_after: int | None) -> dict[str, Any]:
        self.begin()  # config.yaml; resume from the last checkpoint, or evaluate the start (step 0)
        bar, by_tokens = self.progress_bar()
        if self.progress and self.is_main and self.budget_left():
            bar.set_postfix_str(f"eta≈{format_seconds(seconds_left(self))} (estimated before the first step)")
        done_here = 0
        while self.budget_left() and (stop_after is None or done_here < stop_after):
            tokens_before = self.tokens_generated
            row = self.train_step()
            if self.eval_due(tokens_before) or not self.budget_left():
                row["eval_accuracy"] = self.evaluate(self.config.eval_n)
            self.log.append(row)
            if self.on_step:
                self.on_step(self, row)
            if self.step % self.config.checkpoint_every == 0 and self.is_main:
                self.save_checkpoint()
            bar.update(min(self.tokens_generated, bar.total) - bar.n if by_tokens else 1)
            bar.set_postfix(**({"step": self.step} if by_tokens else {}), reward=f"{row['reward_mean']:.2f}",
                            **({"eval": f"{row['eval_accuracy']:.3f}"} if "eval_accuracy" in row else {}))
            done_here += 1
        bar.close()
        if stop_after is not None and done_here >= stop_after:
            return {"stopped_at": self.step}
        return self.finish()

    def progress_bar(self) -> tuple[tqdm, bool]:
        """The run's bar, and whether it counts generated tokens: it does when the token budget ends the run
        before the step count can (a `max_generated_tokens` run with a large `steps`), so that tqdm's own
        ETA is the time to the budget and not to a step count the run never reaches."""
        c = self.config
        by_tokens = steps_ahead(self) < c.steps - self.step
        if by_tokens:
            bar = tqdm(total=c.max_generated_tokens, initial=min(self.tokens_generated, c.max_generated_tokens),
                       unit="tok", unit_scale=True, desc=f"train {c.method}", disable=not self.progress,
                       dynamic_ncols=True)
        else:
            bar = tqdm(total=c.steps, initial=self.step, unit="step", desc=f"train {c.method}",
                       disable=not self.progress, dynamic_ncols=True)
        return bar, by_tokens

    def begin(self) -> None:
        """Write config.yaml (a new run), then restore the newest checkpoint or log the step-0 evaluation.
        A resumed run's config.yaml is rewritten when it differs from the config it resumes with (a run
        extended with --steps), so that the file always describes the run."""
        os.makedirs(self.run_dir, exist_ok=True)
        config_path = os.path.join(self.run_dir, "config.yaml")
        if self.is_main and not os.path.exists(config_path):
            atomic_write_text(config_path, dump_yaml(self.config))
            atomic_write_text(os.path.join(self.run_dir, KIND_MARKER), "train\n")
        if not self.is_main:  # only the main process writes the run directory
            self.log = NullLog(self.log.path)
        resumed = self.restore()
        if not resumed:  # every rank checks: a refusal on the main one alone would leave the others waiting
            check_restartable(self.run_dir, self.config)
        if self.is_main:  # the checks passed: config.yaml describes the run (an extended --steps included)
            update_config_yaml(config_path, self.config)
            self.trackers, self.log = open_trackers(self.config, self.tracking, self.step if resumed else None, self.log)
        if not resumed:
            self.log.truncate_after(-1)
            self.log.append({"step": 0, "tokens_generated": 0, "seconds": 0.0, "eval_accuracy": self.evaluate(self.config.eval_n)})

    def finish(self) -> dict[str, Any]:
        """The final evaluation, weights and summary.json."""
        final = {"step": self.step, "tokens_generated": self.tokens_generated, "seconds": round(self.seconds, 3),
                 "credo_commit": loaded_commit()}
        if self.config.final_eval_n > 0:
            final["final_accuracy"] = self.evaluate(self.config.final_eval_n)
            final["final_eval_n"] = self.eval_size  # the task may hold fewer than asked for
        if self.longest_solution is not None:
            final["overlong_buffer_used"], final["longest_worked_solution"] = self.overlong_buffer, self.longest_solution
        if self.is_main:
            self.policy.save(os.path.join(self.run_dir, "final"))
            atomic_write_text(os.path.join(self.run_dir, "summary.json"), json.dumps(final, indent=2) + "\n")
            if self.trackers is not None:
                self.trackers.log_summary(final)
        if self.dp is not None:
            self.dp.barrier()
        return final

    def eval_due(self, tokens_before: int) -> bool:
        every = self.config.eval_every_tokens
        if every > 0:
            return self.tokens_generated // every > tokens_before // every
        return self.step % self.config.eval_every == 0

    def budget_left(self) -> bool:
        c = self.config
        return self.step < c.steps and (c.max_generated_tokens <= 0 or self.tokens_generated < c.max_generated_tokens)

    def evaluate(self, n: int) -> float:
        """Greedy accuracy on up to n held-out problems; `self.eval_size` records how many there were and
        `self.eval_seconds` how long it took."""
        self.policy.model.eval()
        problems = self.task.heldout_problems(n)
        self.eval_size = len(problems)
        began = time.perf_counter()
        accuracy = evaluate(self.policy, self.task, problems, max_new_tokens=self.config.sampling.max_new_tokens,
                            progress=self.progress and n >= 256).accuracy
        self.eval_seconds = time.perf_counter() - began
        return accuracy

    # --- checkpoints ----------------------------------------------------------------------------------
    def checkpoint_dir(self, step: int) -> str:
        return os.path.join(self.run_dir, "checkpoints", f"step-{step:06d}")

    def save_checkpoint(self) -> None:
        """Atomic checkpoint: weights, trainer_state.{safetensors,json} (no pickle), manifest.json last."""
        with atomic_directory(self.checkpoint_dir(self.step)) as tmp:
            self.policy.save_into(tmp)
            tensors, optimizer_meta = optimizer_state(self.optimizer.state_dict())
            stream_tensors, stream_states = self.streams.state()
            save_state(tmp, "trainer_state", {**tensors, **stream_tensors}, {
                "step": self.step, "tokens_generated": self.tokens_generated, "tokens_scored": self.tokens_scored,
                "seconds": self.seconds, "optimizer": optimizer_meta, "config": to_dict(self.config), **stream_states})
            write_manifest(tmp)
        existing = sorted(d for d in os.listdir(os.path.join(self.run_dir, "checkpoints")) if d.startswith("step-"))
        for old in existing[:-self.config.keep_checkpoints]:
            shutil.rmtree(os.path.join(self.run_dir, "checkpoints", old), ignore_errors=True)

    def last_checkpoint(self) -> str | None:
        return last_checkpoint(self.run_dir)

    def restore(self) -> bool:
        """Load the newest checkpoint of run_dir, if any, after verifying its manifest; returns whether one was found."""
        path = self.last_checkpoint()
        if path is None:
            return False
        verify_manifest(path)
        check_safetensors(path)
        tensors, state = load_state(path, "trainer_state")
        try:
            self.policy.load_weights_from(path)
            self.optimizer.load_state_dict(optimizer_state_dict(tensors, state["optimizer"]))
            self.streams.load(tensors, state)
            self.step, self.tokens_generated = int(state["step"]), int(state["tokens_generated"])
            self.tokens_scored, self.seconds = int(state["tokens_scored"]), float(state["seconds"])
        except (KeyError, ValueError, TypeError, RuntimeError) as err:
            raise CorruptStateError(f"checkpoint {path} does not fit this run ({type(err).__name__}: {err})") from None
        check_resumable(state, self.config, self.step, path, self.accept_unrecorded_checkpoint)
        self.log.truncate_after(self.step, must_reach=True)
        return True


class TrainingDiverged(UserError):
    """Training produced a non-finite loss or gradient; the message names the step and the last good checkpoint."""
