"""The RL trainer's run: the loop around credo.train.step.TrainerStep, with evaluation, progress and its ETA,
checkpoints and the run directory.

`Trainer(config, run_dir).train()` writes config.yaml, evaluates the start (step 0), then steps until the step
or token budget is spent, evaluating when due, logging each step's metrics row and checkpointing; it ends with the
final evaluation, final/ and summary.json. A run directory holds config.yaml, metrics.jsonl, checkpoints/step-N
(atomic, pickle-free, verified), credit/step-N.safetensors (a few rows' credit every train.credit_log_every
steps: credo.train.credit_log) and final/. `--resume RUN_DIR` restarts from the last checkpoint with every random
stream restored, so a resumed run on CPU ends with the same metrics as one that was never interrupted.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from typing import Any, Callable

from tqdm import tqdm

from credo.core.config import dump_yaml, to_dict
from credo.core.files import MetricsLog, NullLog, atomic_directory, atomic_write_text
from credo.core.outputs import KIND_MARKER, run_lock
from credo.core.state_io import (CorruptStateError, check_safetensors, load_state, optimizer_state,
                                 optimizer_state_dict, save_state, verify_manifest, write_manifest)
from credo.integrations.trackers import TrackingPlace
from credo.integrations.tracking import check_trackers, closing_trackers, open_trackers
from credo.core.protocols import Policy
from credo.train.config import TrainConfig
from credo.train.eta import format_seconds, seconds_left, steps_ahead
from credo.train.evaluate import evaluate
from credo.policy.device import hardware
from credo.train.provenance import loaded_commit
from credo.train.resume_checks import check_restartable, check_resumable, update_config_yaml
from credo.train.plan import Plan
from credo.train.step import TrainerStep


class Trainer(TrainerStep):
    """GRPO-family trainer over any Policy backend: the step's phases (TrainerStep) in a resumable run. on_step:
    called after each step with its metrics row; tracking: where the trackers of `config.report_to` write
    (default: in run_dir; credo.integrations.tracking); plan, policy: see TrainerStep."""

    def __init__(self, config: TrainConfig, run_dir: str, policy: Policy | None = None, progress: bool = True,
                 on_step: Callable[["Trainer", dict], None] | None = None,
                 accept_unrecorded_checkpoint: bool = False, tracking: TrackingPlace | None = None,
                 plan: Plan | None = None) -> None:
        self.on_step = on_step
        self.accept_unrecorded_checkpoint = accept_unrecorded_checkpoint  # resume_checks.check_resumable
        self.tracking, self.trackers = tracking or TrackingPlace.for_run(run_dir), None  # opened by begin()
        # installed, its store a folder, a remote one answering: before a model loads or --out is touched
        check_trackers(config.report_to, "train.report_to", self.tracking)
        loaded_commit()  # summary.json's credo_commit, read while what is on disk is the code this process loaded
        super().__init__(config, run_dir, policy, progress, plan)
        self.log = MetricsLog(os.path.join(run_dir, "metrics.jsonl"))

    # --- the loop -------------------------------------------------------------------------------------
    def train(self, stop_after: int | None = None) -> dict[str, Any]:
        """Run until the step/token budget is spent (or `stop_after` steps in this call, for tests). The main
        process holds the run directory's lock meanwhile (credo.core.outputs.run_lock)."""
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
            if getattr(self, "credit_parts", None):  # the credit's parts, as separate metrics, to the trackers only
                self.log.append(row, tracked_only=self.credit_parts)
            else:
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
            self.trackers, self.log = open_trackers(self.config, self.tracking,
                                                    self.step if resumed else None, self.log)
        if not resumed:
            self.log.truncate_after(-1)
            self.log.append({"step": 0, "tokens_generated": 0, "seconds": 0.0,
                             "eval_accuracy": self.evaluate(self.config.eval_n)})

    def finish(self) -> dict[str, Any]:
        """The final evaluation, weights and summary.json."""
        final = {"step": self.step, "tokens_generated": self.tokens_generated, "seconds": round(self.seconds, 3),
                 "credo_commit": loaded_commit(), "machine": hardware(self.policy.device)}
        if self.config.final_eval_n > 0:
            final["final_accuracy"] = self.evaluate(self.config.final_eval_n)
            final["final_eval_n"] = self.eval_size  # the task may hold fewer than asked for
        if self.longest_solution is not None:
            final["overlong_buffer_used"] = self.overlong_buffer
            final["longest_worked_solution"] = self.longest_solution
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
        """Greedy accuracy on up to n problems of the run's evaluation split (train.eval_split); `self.eval_size`
        records how many there were and `self.eval_seconds` how long it took."""
        self.policy.model.eval()
        problems = (self.task.validation_problems(n) if self.config.eval_split == "validation"
                    else self.task.heldout_problems(n))
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

    def restore(self) -> bool:
        """Load the newest checkpoint of run_dir, if any, after verifying its manifest; returns whether one was
        found."""
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
