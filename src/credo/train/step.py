"""One optimisation step of the RL trainer, phase by phase; credo.train.trainer.Trainer runs the steps.

`TrainerStep.train_step`, in order:
  1. collect: the strategy draws prompts and samples G completions each, rewarded by the task's verifier
     (plain, DAPO dynamic sampling or RRPO/SRPO resets: credo.strategies);
  2. prepare: DAPO's overlong penalty shapes the rewards (credo.train.shaping);
  3. prepare: old (and reference) log-probs from one no-grad scoring pass;
  4. segment: the batch cut into steps, when the estimator reads them (credo.core.segment);
  5. assign_credit: the estimator's credit, through a counted Probe;
  6. update: `epochs` passes of `minibatches` AdamW steps on the clipped surrogate (credo.core.loss).
What the run's settings name (estimator, credit config, strategy) is resolved once, into `self.plan`
(credo.train.plan). Subclass and override a phase to try an idea.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import replace
from typing import Any

import torch

from credo.core.config import ConfigError, UserError
from credo.core.files import last_checkpoint
from credo.core.loss import policy_loss
from credo.core.probe import Probe
from credo.core.protocols import Policy
from credo.core.rollouts import Cost, Credit, Rollouts
from credo.core.segment import segmentation_stage
from credo.integrations.shards import process_group_gather
from credo.policy import bind_task, check_policy_path, load_policy
from credo.policy.adapters import LORA_SEED_OFFSET, AdapterDisabled, is_lora, seeded_rng
from credo.policy.device import autocast_dtype, device_name, resolve_device, resolve_dtype
from credo.strategies import Collected, SamplingContext, Strategy
from credo.strategies.localisers import check_can_ask
from credo.tasks import make_task
from credo.train import credit_log
from credo.train.config import TrainConfig
from credo.train.distributed import DataParallel, Sharded
from credo.train.plan import Plan, with_plan
from credo.train.sft import ensure_sft
from credo.train.shaping import fitted_overlong_buffer, overlong_penalty
from credo.train.starts import NAMED_START, named_start
from credo.train.streams import RandomStreams


class TrainerStep:
    """The model, its optimiser, the run's random streams, the probe and the plan, and one step over them.
    `plan`: the run's plan, with `config` as credo.train.plan.plan_run returned them both (None: `config` is
    planned here, e.g. one built in code); `policy`: a loaded policy to train instead of `config.start` (tests)."""

    skip_without_signal = True  # a mini-batch whose gradient is zero skips its forward and backward (without_signal)

    def __init__(self, config: TrainConfig, run_dir: str, policy: Policy | None = None, progress: bool = True,
                 plan: Plan | None = None) -> None:
        self.run_dir, self.progress = run_dir, progress
        self.task = make_task(config.task, config.task_options, prefix="train.task_options.")
        if config.eval_split == "validation":
            self.task.train_exclude = frozenset(p.key for p in validation_split(self.task, config))
        if plan is None:  # the estimator, its checked options and the strategy, resolved once
            config, plan = with_plan(config)
        self.config, self.plan = config, plan
        if policy is None:
            device = resolve_device(config.device, "train.device")  # before the start is read: one line, exit 2
            dtype = resolve_dtype(config.dtype, device, "train.dtype")
            policy = load_policy(self.start_path(), device=device, lora=config.lora, seed=config.seed, dtype=dtype,
                                 autocast=autocast_dtype(config.dtype))
        # config.yaml records the device the run trains on ('auto' resolved), so that a resume or a comparison
        # reusing the run continues on it, and moving it elsewhere is asked for explicitly (docs/gpu.md)
        self.config = config = replace(config, device=device_name(policy.device))
        self.policy = bind_task(policy, self.task, "train.start", config.sampling.max_new_tokens)  # now, not mid-run
        for field, localiser in (("train.reset.localiser", config.strategy == "resets" and config.reset.localiser),
                                 ("train.credit.localiser", config.credit.get("localiser"))):
            if localiser == "prompt":  # a request the policy cannot read: refused now, not at the first reset
                check_can_ask(self.policy, self.task, field)
        self.reference = reference_of(self.policy) if config.loss.kl_coef > 0 else None
        self.optimizer = torch.optim.AdamW([p for p in self.policy.model.parameters() if p.requires_grad], lr=config.lr,
                                           betas=(config.beta1, config.beta2), weight_decay=config.weight_decay,
                                           fused=config.fused_adamw or None)
        self.streams = RandomStreams.seeded(config.seed)
        self.step, self.tokens_generated, self.tokens_scored, self.seconds = 0, 0, 0, 0.0
        self.reached: list[bool] = []  # which trainable weights the last backward gave a gradient (without_signal)
        self.dp = self.data_parallel()
        # batch-wide statistics (RREDCoT's z, SC-GRPO's quantile) over every rank's rows, as one process sees them
        gather = None
        if self.dp is not None and self.dp.world > 1:
            gather = process_group_gather()
        self.probe = Probe(self.policy, self.task, config.sampling, self.streams.probe, gather=gather)
        self.strategy: Strategy = self.plan.strategy
        self.overlong_buffer, self.longest_solution = fitted_overlong_buffer(config, self.task, self.policy)
        if self.dp is not None:
            self.strategy = Sharded(self.strategy, self.dp, config.seed)

    def start_path(self) -> str:
        if self.config.start.startswith(NAMED_START):
            return named_start(self.config.start, "train.start", self.config.task, self.progress)
        if self.config.start:  # checked first: load_policy's error would not name the field
            return check_policy_path(self.config.start, "train.start")
        return ensure_sft(progress=self.progress, task=self.config.task)

    def data_parallel(self) -> DataParallel | None:
        """The process group of a data-parallel launch (None when the run is not data-parallel)."""
        if not self.config.data_parallel:
            return None
        dp, prompts = DataParallel(), self.config.prompts_per_step
        if prompts % dp.world:
            raise ConfigError(f"train.prompts_per_step={prompts} must be divisible by the {dp.world} "
                              "data-parallel processes")
        return dp

    @property
    def on_policy(self) -> bool:
        """One epoch of one mini-batch: a single update, by the policy that sampled the batch."""
        return self.config.epochs == 1 and self.config.minibatches == 1

    @property
    def is_main(self) -> bool:
        return self.dp is None or self.dp.is_main

    def last_checkpoint(self) -> str | None:
        return last_checkpoint(self.run_dir)

    # --- one step, phase by phase (the module docstring's order) ---------------------------------------
    def train_step(self) -> dict[str, Any]:
        """One optimisation step; returns its metrics row."""
        started = time.time()
        # sampling and every gradient-free scoring (old and reference log-probs, the estimator's probes) without
        # dropout; only update() trains: a model with dropout (lora.dropout) then scores the same after a resume
        self.policy.model.eval()
        collected = self.collect()                   # 1. prompts, G completions each, the verifier's rewards
        rollouts = self.prepare(collected)           # 2-3. shaped rewards, old and reference log-probs
        rollouts, cut = self.segment(rollouts)       # 4. segment_ids, when the estimator reads the batch's
        credit = self.assign_credit(rollouts)        # 5. the estimator's credit (its Probe cost metered)
        update_stats = self.update(rollouts, credit)  # 6. epochs x minibatches AdamW steps
        self.step += 1
        self.keep_credit(rollouts, credit)           # every credit_log_every steps: a few rows' credit, to disk
        return self.record(collected, cut + credit.cost, rollouts, credit, update_stats, time.time() - started)

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
        rewards = rollouts.rewards + overlong_penalty(rollouts.lengths, c.sampling.max_new_tokens,
                                                      self.overlong_buffer, c.overlong_penalty)
        args = (rollouts.prompt_ids, rollouts.prompt_mask, rollouts.completion_ids, rollouts.completion_mask)
        # one epoch of one mini-batch updates the very policy that sampled: the update reads its own log-probs,
        # detached, as the old ones (ratio exactly 1, as TRL does with num_iterations=1), so this forward is
        # skipped when the rows already carry the sampler's log-probs (estimators such as SPO's cutpoints read them)
        skip = self.on_policy and collected.sampled_logprobs
        old = rollouts.old_logprobs if skip else self.policy.score(*args)[0]
        ref = self.reference.score(*args)[0] if self.reference is not None else None
        return rollouts.with_fields(rewards=rewards, old_logprobs=old, ref_logprobs=ref)

    def segment(self, rollouts: Rollouts) -> tuple[Rollouts, Cost]:
        """The segmentation stage: the batch cut into segments (steps) by the task's segmenter when the estimator
        reads them (Plan.segments_batch), with what cutting spent through the probe (an entropy pass for
        `keyword_entropy`; nothing for `lines`)."""
        return segmentation_stage(rollouts, self.probe, self.plan.segments_batch)

    def assign_credit(self, rollouts: Rollouts) -> Credit:
        return self.plan.estimator(rollouts, self.probe, self.plan.credit)

    def update(self, rollouts: Rollouts, credit: Credit) -> dict[str, float]:
        c = self.config
        mask = rollouts.trainable_mask()
        if credit.loss_mask is not None:
            mask = mask & credit.loss_mask
        # data parallel: token-mean divides by the *global* token count, so the ranks' average is the global loss
        scale = 1.0
        if self.dp is not None and c.loss.aggregation == "token-mean":
            local = float(mask.sum())
            scale = local * self.dp.world / max(self.dp.sum(local), 1.0)
        stats: dict[str, float] = {"loss": 0.0, "clip_frac": 0.0, "kl": 0.0, "grad_norm": 0.0, "update_norm": 0.0}
        self.clipped = torch.zeros(mask.shape, dtype=torch.bool)  # each token's clip in the last pass over its row
        self.policy.model.train()
        with self.dropout_rng():
            n_updates = self.update_passes(rollouts, credit, mask, scale, stats)
        return {k: v / max(n_updates, 1) for k, v in stats.items()}

    def dropout_rng(self) -> contextlib.AbstractContextManager:
        """With lora.dropout > 0, the update draws its dropout masks from the global RNG seeded by the run's seed
        and step (restored after), so a resumed run draws the same masks; without it, nothing changes."""
        if self.config.lora.r == 0 or self.config.lora.dropout == 0:
            return contextlib.nullcontext()
        return seeded_rng(self.config.seed * 1_000_003 + self.step + LORA_SEED_OFFSET, self.policy.model)

    def update_passes(self, rollouts: Rollouts, credit: Credit, mask: torch.Tensor, scale: float,
                      stats: dict[str, float]) -> int:
        """The `epochs` x `minibatches` AdamW steps of update(), summing their statistics into `stats`;
        -> the number of steps taken."""
        c, B, n_updates = self.config, rollouts.batch_size, 0
        for _ in range(c.epochs):
            order = list(range(B))
            self.streams.minibatch.shuffle(order)
            for chunk in range(c.minibatches):
                idx = torch.tensor(order[chunk::c.minibatches], dtype=torch.long)
                if idx.numel() == 0:
                    continue
                mb = rollouts.select(idx)
                trainable = [p for p in self.policy.model.parameters() if p.requires_grad]
                self.optimizer.zero_grad(set_to_none=True)
                weights = credit.weights[idx] if credit.weights is not None else None
                if self.without_signal(credit.advantages[idx], weights, mask[idx], trainable):
                    loss, s = torch.zeros(()), {"clip_frac": 0.0, "kl": 0.0,
                                             "clipped": torch.zeros(mask[idx].shape, dtype=torch.bool)}
                else:
                    logprobs, _ = self.policy.score(mb.prompt_ids, mb.prompt_mask, mb.completion_ids,
                                                    mb.completion_mask)
                    old = logprobs.detach() if self.on_policy else mb.old_logprobs
                    loss, s = policy_loss(logprobs, old, credit.advantages[idx], mask[idx], c.loss,
                                          norm_length=c.sampling.max_new_tokens,
                                          weights=weights, ref_logprobs=mb.ref_logprobs)
                    (loss * scale).backward()
                    self.reached = [p.grad is not None for p in trainable]
                if self.dp is not None:
                    self.dp.average_gradients(trainable)
                grad_norm = torch.nn.utils.clip_grad_norm_(trainable, c.grad_clip)
                self.check_finite(loss, grad_norm)
                before = [p.detach().clone() for p in trainable]
                self.optimizer.step()
                stats["update_norm"] += update_norm(trainable, before)
                stats["loss"] += float(loss.detach())
                stats["clip_frac"] += s["clip_frac"]
                stats["kl"] += s["kl"]
                stats["grad_norm"] += float(grad_norm)
                self.clipped[idx] = s["clipped"].cpu()
                n_updates += 1
        return n_updates

    def without_signal(self, advantages: torch.Tensor, weights: torch.Tensor | None, mask: torch.Tensor,
                       trainable: list[torch.Tensor]) -> bool:
        """Whether a mini-batch's gradient is zero without computing it, and if so its zero gradients set.

        advantages[b, T], weights[b, T] (or None) and mask[b, T] (the tokens that get gradient) of the mini-batch.
        Zero when the update is on-policy (every ratio is 1, nothing is clipped), in one process, without a KL
        term, the model draws no dropout of its own, every advantage and weight is finite and every advantage on
        the masked tokens is zero (for GRPO: a batch whose groups are all right or all wrong). Every trainable
        weight then gets a zero gradient, as a backward gives it (only once this process's last backward reached
        them all), and AdamW steps as after one (its moments decay, weight decay acts): the same weights and
        metrics, without the forward and backward. Not checked on such a step: the forward's own finiteness
        (found at the next step with signal). A subclass whose loss adds a term sets skip_without_signal False."""
        if (not self.skip_without_signal or not self.reached or not all(self.reached)
                or len(self.reached) != len(trainable) or not self.on_policy or self.dp is not None
                or self.config.loss.kl_coef > 0 or draws_dropout(self.policy.model)):
            return False
        finite = bool(torch.isfinite(advantages).all()) and (weights is None or bool(torch.isfinite(weights).all()))
        if not finite or bool(((advantages != 0) & mask.bool()).any()):
            return False
        for parameter in trainable:
            parameter.grad = torch.zeros_like(parameter)
        return True

    def keep_credit(self, rollouts: Rollouts, credit: Credit) -> None:
        """The credit log (credo.train.credit_log): this step's credit parts for the trackers (`credit_parts`, when
        the run reports to any) and, every credit_log_every steps, its first rows to RUN/credit/ (main process)."""
        c = self.config
        due = c.credit_log_every > 0 and self.step % c.credit_log_every == 0 and self.is_main
        if not due and not c.report_to:
            self.credit_parts = None
            return
        parts = credit_log.components(rollouts, credit, getattr(self, "clipped", None))
        self.credit_parts = credit_log.tracker_metrics(parts) if c.report_to and self.is_main else None
        if due:
            credit_log.write_step(self.run_dir, self.step, c.method, rollouts, parts, c.credit_log_rows,
                                  self.policy.token_strings)

    def check_finite(self, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        """Stop before a non-finite update reaches the weights; the last checkpoint stays the last good one."""
        for what, value in (("loss", loss), ("gradient norm", grad_norm)):
            if not bool(torch.isfinite(value.detach())):
                last = self.last_checkpoint()
                raise TrainingDiverged(
                    f"step {self.step + 1}: non-finite {what} ({float(value.detach()):g}); stopped before "
                    "updating the weights. "
                    f"Last good checkpoint: {last or 'none (the run never checkpointed)'}. Lower train.lr or "
                    "check the rewards, then --resume or start again with --force")

    def record(self, collected: Collected, credit_cost: Cost, rollouts: Rollouts, credit: Credit,
               update_stats: dict[str, float], seconds: float) -> dict[str, Any]:
        """Count the step's tokens into the run's totals and return its metrics row (global when data-parallel).
        credit_cost: the Probe work of segmenting and of the estimator."""
        spent = credit_cost + collected.cost  # credit's and the strategy's (localisers') Probe work
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
            for key in ("reward_mean", "train_accuracy", "completion_length", "advantage_abs_mean",
                        "loss", "clip_frac", "kl"):
                row[key] = self.dp.mean(row[key])
        return row


def validation_split(task: Any, config: TrainConfig) -> list:
    """Every problem a run on the validation split evaluates on (the most either evaluation asks for), which its
    training draws then skip; a task without one is a ConfigError naming train.eval_split."""
    if not hasattr(task, "validation_problems"):
        raise ConfigError("train.eval_split=validation needs a task with a validation split (arith, arith-long, "
                          f"gym:<name>); task {task.name!r} has none")
    return task.validation_problems(max(config.eval_n, config.final_eval_n))


def reference_of(policy: Policy) -> object:
    """The KL term's reference: a LoRA policy's base, its adapters switched off (the same weights, no copy); any
    other policy's copy as it starts."""
    if is_lora(policy.model):
        return AdapterDisabled(policy)
    return policy.copy()


class TrainingDiverged(UserError):
    """Training produced a non-finite loss or gradient; the message names the step and the last good checkpoint."""


def draws_dropout(model: torch.nn.Module) -> bool:
    """Whether a forward of `model` in training mode draws random numbers: a dropout module with p > 0, or a
    dropout rate above 0 in its config (attention_dropout, hidden_dropout_prob, resid_pdrop, ...)."""
    if any(isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules()):
        return True
    config = getattr(model, "config", None)
    rates = vars(config) if config is not None and hasattr(config, "__dict__") else {}
    return any(("dropout" in key or key.endswith("pdrop")) and isinstance(rate, (int, float))
               and not isinstance(rate, bool) and rate > 0 for key, rate in rates.items())


def update_norm(parameters: list[torch.Tensor], before: list[torch.Tensor]) -> float:
    """||theta_after - theta_before||_2 over the trainable parameters: the size of one optimiser update after
    Adam's normalisation, what gradient-norm clipping does not show (a method clipped on every step runs
    normalised-gradient Adam, its updates no smaller than an unclipped method's)."""
    return float(torch.sqrt(sum(((p.detach() - b).double() ** 2).sum() for p, b in zip(parameters, before))))
