"""credo credit inside TRL: a `GRPOTrainer` subclass that hands TRL per-token advantages.

    from credo.integrations.trl import CreditGRPOTrainer
    trainer = CreditGRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(...), train_dataset=...,
                                credit="rredcot", credit_config={"lam": 0.5}, task=make_task("gym:chain_sum"))

After TRL samples and scores a batch, the subclass builds credo `Rollouts` from it (TRL's left-padded
prompts and right-padded completions, group = position // num_generations, rewards = TRL's
weighted reward sum), runs the named credo estimator through a Probe backed by the trainer's own
model, and replaces TRL's per-sequence advantages with the estimator's `(B, T)` advantages, which
TRL's loss accepts as they are. Token weights (SC-GRPO) are folded into the advantages (the clipped
surrogate is linear in a non-negative weight); a loss mask (SPO-chain) becomes TRL's `tool_mask`, so the
masked tokens leave TRL's loss, its KL term and its token count.
Across processes (accelerate/DeepSpeed): each process runs the estimator on its own rows, which must
be whole groups (TRL deals the generation batch out in contiguous slices, so the per-process batch,
per_device_train_batch_size * steps_per_generation, must be a multiple of num_generations; checked);
group ids are global and batch-wide statistics (RREDCoT's z, SC-GRPO's quantile) are gathered over
all processes (Probe.gather), so N processes give the advantages of one process on the same rollouts.
TRL's logged advantages are replaced by the per-sequence means of credo's advantages.
For `grpo` the subclass reproduces TRL's own advantages (sample std + 1e-4, as TRL computes them).
TRL settings that only shape TRL's own advantages (`scale_rewards` other than "group",
`multi_objective_aggregation` other than "sum_then_normalize") are refused at construction: credo's
estimator would silently replace them. On-policy TRL returns no old log-probs; estimators that probe the
model get them scored (SPO-chain's cut points read p_old). Rows need the dataset's `answer` column when a
task is given. Prompts the Probe builds itself (SC-GRPO's teacher) render as TRL rendered the batch's
(`TRLPromptPolicy`): a difference in format alone would otherwise read as credit.

With TRL's vLLM generation (`use_vllm=True`) only sampling moves to vLLM: the Probe still scores (and,
for MC estimators, samples continuations) with the training model as it is on this process, so credit
is computed under the current weights, the same weights TRL's loss uses; vLLM's own weights are synced
by TRL and never read by credo. Budget the Probe's extra forwards on the training GPUs.

Credit sanity checks (credo.integrations.checks, on by default, `credit_checks=False` turns them off) run on
every batch before the advantages reach TRL: finite rewards (a row every reward function left None or NaN
counts as not finite: credo would read it as 0), each group's rows sharing one prompt, finite advantages,
the estimator's masks equal to TRL's completion and tool masks, zero credit on padding and masked tokens,
and for grpo/dr_grpo/rloo group sums ~0. A failure is a CreditCheckError naming the check, the row (in
TRL's generation batch) and TRL's global_step. `leak_check=True` adds the masked-perturbation invariance
check (credo.integrations.leak_check): the padding of TRL's completion ids and old log-probs refilled with random
values must leave every real token's credit unchanged.
"""

from __future__ import annotations

import copy
import dataclasses
import time
import warnings
from typing import Any

import torch

from credo.integrations.trl_versions import (SUPPORTED_TRL, TESTED_TRL,
                                               UntestedTRLWarning, untested_trl_message)

try:
    import trl
    from trl import GRPOTrainer
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(f"credo.integrations.trl needs trl (tested: {', '.join(TESTED_TRL)}): "
                      f"pip install trl=={SUPPORTED_TRL}") from err

if untested_trl_message(trl.__version__):
    warnings.warn(untested_trl_message(trl.__version__), UntestedTRLWarning, stacklevel=2)

from credo import credit as credit_registry  # noqa: E402
from credo.integrations import checks  # noqa: E402
from credo.integrations.leak_check import check_estimator_invariance, folded  # noqa: E402
from credo.integrations.shards import process_group_gather  # noqa: E402
from credo.core.protocols import Problem, SamplingConfig, left_pad  # noqa: E402
from credo.policy.base import as_prompt, render_plain  # noqa: E402
from credo.policy.hf import HFPolicy  # noqa: E402
from credo.core.probe import Probe, sampling_refusal  # noqa: E402
from credo.core.rollouts import Rollouts  # noqa: E402
from credo.core.segment import segmentation_stage  # noqa: E402


class CreditGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose advantages come from a credo estimator.

    credit: estimator name (`credo methods`). credit_config: its options. task: a credo task (answer
    template, verifier, teacher context) for estimators that probe the model; the dataset's `answer`
    column becomes each problem's gold answer. sampling: what the Probe samples with (MC estimators).
    credit_checks: run credo's credit sanity checks on every batch (credo.integrations.checks).
    leak_check: also run the masked-perturbation invariance check (credo.integrations.leak_check; the
    estimator runs twice per batch).
    Every other argument is GRPOTrainer's, `peft_config` included: with a peft LoraConfig TRL trains the adapter
    alone, its KL reference is the base with the adapter disabled, and credo's Probe scores through the adapted
    model, the one TRL trains (never a copy).
    """

    def __init__(self, *args: Any, credit: str = "grpo", credit_config: dict | None = None, task: Any = None,
                 sampling: SamplingConfig | None = None, credit_checks: bool = True, leak_check: bool = False,
                 **kwargs: Any) -> None:
        # everything credo can check is checked before TRL loads models and reference models
        self.credit_spec = credit_registry.get(credit)
        options = dict(credit_config or {})
        if credit == "grpo":
            options.setdefault("eps", 1e-4)  # TRL adds 1e-4 to the std
        self.credit_options = self.credit_spec.make_config(options)
        if self.credit_spec.probes_model(self.credit_options) and task is None:
            raise ValueError(f"estimator {credit!r} probes the model: pass task=credo.tasks.make_task(...)")
        args_ = kwargs.get("args", args[2] if len(args) > 2 else None)  # GRPOTrainer(model, reward_funcs, args, ...)
        if args_ is not None:
            _check_trl_settings(args_, credit)
        super().__init__(*args, **kwargs)
        per_process = self.args.per_device_train_batch_size * self.args.steps_per_generation
        if per_process % self.num_generations:
            raise ValueError(f"credo credit needs whole groups on each process: per_device_train_batch_size x "
                             f"steps_per_generation ({per_process}) must be a multiple of num_generations "
                             f"({self.num_generations})")
        self.credit_task = task
        self.credit_checks = bool(credit_checks)
        self.leak_check = bool(leak_check)
        # an MC estimator's continuations come from the policy TRL samples from: its temperature and top_p
        self.credit_sampling = sampling or SamplingConfig(temperature=self.args.temperature, top_p=self.args.top_p,
                                                          max_new_tokens=self.max_completion_length)
        self.credit_generator = torch.Generator().manual_seed(self.args.seed)
        self._credo_rewards: torch.Tensor | None = None
        self._credo_inputs: list[dict] = []
        self._credo_prompts: list[tuple[Any, list | None]] | None = None
        self.credit_cost_total = {"tokens_scored": 0, "tokens_generated": 0}
        self.credit_seconds_total = 0.0  # wall time of credo's credit step (rollouts + estimator), this process

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):  # noqa: ANN001, ANN202
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._credo_rewards = rewards_per_func
        return rewards_per_func

    def _tokenize_prompts(self, prompts: list):  # noqa: ANN202
        """Records the prompts as TRL renders them (an environment's reset() observation appended to the last
        message) with each row's tools, so the Probe's own prompts are built from the same conversations."""
        if self.environment_factories is not None:
            tools = [self._env_tools[name] or None for name in self._batch_environments]
        else:
            tools = [self.tools or None] * len(prompts)
        self._credo_prompts = [(copy.deepcopy(p), t) for p, t in zip(prompts, tools)]
        return super()._tokenize_prompts(prompts)

    def _generate_and_score_completions(self, inputs):  # noqa: ANN001, ANN202
        self._credo_inputs = list(inputs)
        self._credo_prompts = None  # set by _tokenize_prompts (a rollout_func tokenises on its own: the rows' prompts)
        output = super()._generate_and_score_completions(inputs)
        if not self.model.training:
            return output
        started = time.perf_counter()
        gather = process_group_gather() if self.accelerator.num_processes > 1 else None
        probe = Probe(self._probe_policy(), self.credit_task, self.credit_sampling,
                      self.credit_generator, gather=gather)
        rollouts = self._rollouts(output, probe)
        where = self._check_where(len(rollouts.rewards)) if self.credit_checks else None
        if where is not None:
            checks.check_rewards(rollouts.rewards, where, "reward (TRL's weighted sum; NaN: no function scored it)")
            checks.check_groups(rollouts.group, [x.get("prompt") for x in self._credo_inputs], where)
        probe.no_sampling = sampling_refusal(rollouts)
        rollouts, cut = segmentation_stage(rollouts, probe, self.credit_spec.reads_batch_segments(self.credit_options))
        state = probe.generator.get_state()
        result = self.credit_spec(rollouts, probe, self.credit_options)
        result.cost = cut + result.cost  # credit's Probe work: segmenting, then the estimator
        if self.leak_check:
            leak_where = dataclasses.replace(self._check_where(len(rollouts.rewards)), off="leak_check=False")
            check_estimator_invariance(self.credit_spec, rollouts, probe, self.credit_options, leak_where,
                                       before=folded(result), generator_state=state)
        advantages = result.advantages
        if result.weights is not None:
            advantages = advantages * result.weights
        if result.loss_mask is not None:
            self._apply_loss_mask(output, result.loss_mask)
            advantages = advantages * result.loss_mask  # for the logged means only: the mask already drops them
        if where is not None:
            self._check_credit(output, rollouts, result.loss_mask, advantages, where)
        output["advantages"] = advantages.to(output["completion_ids"].device)
        self._replace_logged_advantages(advantages, rollouts.trainable_mask())
        self.credit_cost_total["tokens_scored"] += result.cost.tokens_scored
        self.credit_cost_total["tokens_generated"] += result.cost.tokens_generated
        self.credit_seconds_total += time.perf_counter() - started
        mode = "train"
        self._metrics[mode]["credo/tokens_scored"].append(float(result.cost.tokens_scored))
        self._metrics[mode]["credo/tokens_generated"].append(float(result.cost.tokens_generated))
        return output

    # --- building blocks ------------------------------------------------------------------------------
    def _apply_loss_mask(self, output: dict, loss_mask: torch.Tensor) -> None:
        """An estimator's loss mask (SPO-chain trains only its cut segments) as TRL's own `tool_mask`, which
        TRL's loss, KL and entropy terms and its token count (`num_items_in_batch`) all honour. Zeroing the
        advantages instead would leave the masked tokens in the loss's denominators and its KL term."""
        device = output["completion_ids"].device
        mask = loss_mask.to(device).int()
        if output.get("tool_mask") is not None:
            mask = mask * output["tool_mask"]
        output["tool_mask"] = mask
        counted = output["completion_mask"] * mask
        output["num_items_in_batch"] = self.accelerator.gather(counted.sum()).sum()


    def _check_where(self, n: int) -> checks.Where:
        """This batch's place for a check's message: TRL's global_step, rows named in the generation batch."""
        start = self.accelerator.process_index * n
        return checks.Where(step=f"{self.state.global_step} (TRL global_step)", off="credit_checks=False",
                            row_name=lambda i: f"row {start + i} of the generation batch")

    def _check_credit(self, output: dict, rollouts: Rollouts, loss_mask: torch.Tensor | None, advantages: torch.Tensor,
                      where: checks.Where) -> None:
        """The advantages TRL will train on, against TRL's own masks (completion_mask, tool_mask)."""
        real = output["completion_mask"].bool().cpu()
        trainable = real & output["tool_mask"].bool().cpu() if output.get("tool_mask") is not None else real
        credit_trainable = rollouts.trainable_mask().cpu()
        if loss_mask is not None:
            credit_trainable = credit_trainable & loss_mask.bool().cpu()
        advantages = advantages.detach().cpu()
        checks.check_advantages(advantages, real, trainable, where, credit_real=rollouts.completion_mask.cpu(),
                                credit_trainable=credit_trainable)
        if self.credit_spec.name in checks.ZERO_SUM_ESTIMATORS:
            checks.check_group_sums(advantages, trainable, rollouts.group, where)

    def _local_rewards(self, n: int) -> tuple[torch.Tensor, int]:
        """TRL's gathered rewards (weighted sum over reward functions) and this process's first row. A row no
        reward function scored (all None/NaN) sums to 0 under nansum: with the checks on it stays NaN, so the
        rewards_finite check names it; without them it is read as 0, as before."""
        rpf = self._credo_rewards
        weights = self.reward_weights.to(rpf.device).unsqueeze(0)
        summed = (rpf * weights).nansum(dim=1)
        if self.credit_checks:
            return summed.masked_fill(torch.isnan(rpf).all(dim=1), float("nan")), self.accelerator.process_index * n
        return torch.nan_to_num(summed, nan=0.0), self.accelerator.process_index * n

    def _rollouts(self, output: dict, probe: Probe) -> Rollouts:
        completion_ids, completion_mask = output["completion_ids"], output["completion_mask"].bool()
        B = completion_ids.shape[0]
        if B % self.num_generations:
            raise ValueError("credo credit needs whole groups on each process: the per-process "
                             f"batch ({B} rows) must be a multiple of num_generations ({self.num_generations})")
        all_rewards, start = self._local_rewards(B)
        rewards = all_rewards[start:start + B].float().cpu()
        # rows are grouped in blocks of num_generations in TRL's global order; ids stay global
        group = (torch.arange(B) + start) // self.num_generations
        tokenizer = self.processing_class
        texts = [tokenizer.decode(row[m], skip_special_tokens=True) for row, m in zip(completion_ids, completion_mask)]
        problems = []
        for x, (rendered, _) in zip(self._credo_inputs, self._prompts_as_rendered()):
            if self.credit_task is not None and "answer" not in x:  # else every row would count as wrong
                raise ValueError("credo credit with a task reads each row's gold answer from the dataset's 'answer' "
                                 f"column; this dataset's rows have {sorted(x)}")
            prompt = rendered if isinstance(rendered, str) else _last_text(rendered)
            problems.append(Problem(key=prompt, prompt=prompt, answer=str(x.get("answer", "")), data=dict(x)))
        task = self.credit_task
        correct = torch.tensor([bool(task.is_correct(p, t)) if task is not None else float(r) >= 1.0
                                for p, t, r in zip(problems, texts, rewards)])
        old = output.get("old_per_token_logps")
        if old is not None:
            old = old.detach().float().cpu()
        elif self.credit_spec.probes_model(self.credit_options):
            # on-policy TRL returns none (its loss then takes the current log-probs as the old ones): score them,
            # since SPO-chain's cut points and the cutpoints segmenter read p_old (zeros read as p = 1 everywhere)
            old, _ = probe.score(output["prompt_ids"].cpu(), output["prompt_mask"].bool().cpu(), completion_ids.cpu(),
                                 completion_mask.cpu())
        else:
            old = torch.zeros(completion_ids.shape)  # a group estimator never reads them
        # with tools, TRL's tool_mask is 0 on the tool outputs between the model's turns: they stay in the
        # completion (the model read them) but are not trained, so estimators normalise over the model's tokens
        tool_mask = output.get("tool_mask")
        loss_mask = tool_mask.bool().cpu() & completion_mask.cpu() if tool_mask is not None else None
        return Rollouts(prompt_ids=output["prompt_ids"].cpu(), prompt_mask=output["prompt_mask"].bool().cpu(),
                        completion_ids=completion_ids.cpu(), completion_mask=completion_mask.cpu(), group=group,
                        rewards=rewards, old_logprobs=old * completion_mask.cpu(), correct=correct, problems=problems,
                        completions=texts, loss_mask=loss_mask)

    def _prompts_as_rendered(self) -> list[tuple[Any, list | None]]:
        """(prompt, tools) per row of this batch, as TRL tokenised them (else the rows' own prompts)."""
        if self._credo_prompts is not None:
            return self._credo_prompts
        return [(x["prompt"], self.tools or None) for x in self._credo_inputs]

    def _probe_policy(self) -> Any:
        """The trainer's model behind credo's Policy interface, rendering the Probe's own prompts (SC-GRPO's
        teacher) as TRL rendered this batch's (`TRLPromptPolicy`)."""
        from trl.data_utils import is_conversational
        model = self.accelerator.unwrap_model(self.model)
        rows = self._prompts_as_rendered()
        conversational = bool(rows) and is_conversational({"prompt": rows[0][0]})
        conversations: dict[str, tuple[list[dict], list | None]] = {}
        if conversational:
            for messages, tools in rows:
                key = _last_text(messages)
                if key in conversations and conversations[key] != (messages, tools):
                    # a built prompt names its problem by this text only: the teacher would get another row's context
                    raise ValueError("credo credit: two rows of this batch end with the same message but differ before "
                                     f"it (system message, earlier turns or tools): {key[:60]!r}; the Probe could not "
                                     "tell which conversation a prompt it builds belongs to")
                conversations[key] = (messages, tools)
        return TRLPromptPolicy(model, self.processing_class, conversations=conversations, chat=conversational,
                               chat_template=self.chat_template, template_options=self.chat_template_kwargs)

    def _replace_logged_advantages(self, advantages: torch.Tensor, mask: torch.Tensor) -> None:
        per_sequence = (advantages.cpu() * mask).sum(1) / mask.sum(1).clamp(min=1)
        gathered = self.accelerator.gather(per_sequence.to(self.accelerator.device)).cpu()
        logged = self._logs["advantages"]
        for _ in range(min(len(gathered), len(logged))):
            logged.pop()
        logged.extend(gathered.tolist())


def _last_text(messages: list[dict]) -> str:
    """A conversational prompt's last message as text: the problem credo's task sees."""
    content = messages[-1]["content"]
    if not isinstance(content, str):
        raise ValueError("credo credit reads text prompts; this dataset's last prompt message holds "
                         f"{type(content).__name__} content (multimodal prompts are not supported)")
    return content


class TRLPromptPolicy(HFPolicy):
    """HFPolicy whose own prompts tokenise as TRL tokenises the dataset's: the Probe compares what the model
    says under a prompt it builds (SC-GRPO's teacher: the problem plus a reference solution) with what it
    said under TRL's prompt, so any formatting difference between the two would be read as credit.

    chat=False (a dataset of text prompts): TRL tokenises the text as it is (with the tokenizer's special
    tokens), so a built prompt is its plain text, with no chat template. chat=True (conversational rows):
    a built prompt for a problem keeps its row's whole conversation (system message, earlier turns, an
    environment's observation) and tools, the built prompt's system part joined to the row's system message
    (or a system message of its own), tokenised by TRL's call (`apply_chat_template` with TRL's chat template
    and chat_template_kwargs). conversations maps each row's last message text (credo's problem prompt) to its
    (messages, tools); see `conversation` for how a built prompt finds its row.
    """

    def __init__(self, model: torch.nn.Module, tokenizer: Any, *,
                 conversations: dict[str, tuple[list[dict], list | None]],
                 chat: bool, chat_template: str | None = None, template_options: dict | None = None) -> None:
        super().__init__(model, tokenizer, device=model.device, chat=chat, cast=False)
        self.chat = chat  # TRL's rule (the rows' form), not whether the tokenizer has a template
        self.conversations = conversations
        self.chat_template, self.template_options = chat_template, dict(template_options or {})

    def conversation(self, text: Any, system: bool = True) -> tuple[list[dict], list | None]:
        """(messages, tools) of a prompt credo builds, in the conversation of the row it names: a user part
        equal to a row's last message, or ending with it (a task whose teacher prompt puts the reference
        before the problem in the user turn, as arith's does), replaces that message. system=False: one user
        turn (SRPO's localisation request). A user part that names no row is refused: the prompt would
        silently lose the row's system message, earlier turns and tools."""
        prompt = as_prompt(text)
        messages: list[dict] = [{"role": "user", "content": prompt.user}]
        tools = None
        if system:
            key = prompt.user if prompt.user in self.conversations else max(
                (k for k in self.conversations if prompt.user.endswith(k)), key=len, default=None)
            if key is None:
                raise ValueError("credo's probe built a prompt that names no row of this batch "
                                 f"({prompt.user[:60]!r}); "
                                 "its conversation is unknown")
            row_messages, tools = self.conversations[key]
            messages = [dict(m) for m in row_messages]
            messages[-1]["content"] = prompt.user
        if prompt.system:
            if messages[0]["role"] == "system":
                messages[0]["content"] = f"{messages[0]['content']}\n\n{prompt.system}"
            else:
                messages.insert(0, {"role": "system", "content": prompt.system})
        return messages, tools

    def _template_call(self, text: Any, system: bool, tokenize: bool) -> Any:
        messages, tools = self.conversation(text, system)
        options = dict(self.template_options)
        if not tokenize:  # a text rendering (for reading): transformers sanitises control tokens only when tokenising
            options.pop("sanitize_control_tokens", None)
        return self.tokenizer.apply_chat_template([messages], tools=tools, chat_template=self.chat_template,
                                                  add_generation_prompt=True, tokenize=tokenize,
                                                  return_dict=tokenize, **options)

    def format_prompt(self, text: Any, system: bool = True) -> str:
        if not self.chat:
            return render_plain(text)
        return self._template_call(text, system, tokenize=False)[0]

    def encode_prompts(self, texts: Any, system: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.chat:
            return super().encode_prompts(texts, system)
        rows = [list(self._template_call(t, system, tokenize=True)["input_ids"][0]) for t in texts]
        return left_pad(rows, self.pad_id, self.device)


def _check_trl_settings(args: Any, credit: str) -> None:
    """Refuse TRL advantage settings that credo's estimator would silently replace: credo computes the
    advantages itself, so TRL's reward scaling and multi-reward aggregation never reach them."""
    scale = {True: "group", False: "none"}.get(getattr(args, "scale_rewards", "group"),
                                               getattr(args, "scale_rewards", "group"))
    if scale != "group":
        hint = " (credit='dr_grpo' does not divide by the std)" if scale == "none" else ""
        raise ValueError(f"GRPOConfig.scale_rewards={scale!r}: credo's {credit!r} estimator computes the advantages, "
                         f"so TRL's reward scaling would be ignored; keep scale_rewards='group' and choose the "
                         f"normalisation with credit/credit_config{hint}")
    aggregation = getattr(args, "multi_objective_aggregation", "sum_then_normalize")
    if aggregation != "sum_then_normalize":
        raise ValueError(f"GRPOConfig.multi_objective_aggregation={aggregation!r}: credo's "
                         "estimators read the weighted sum of the rewards (sum_then_normalize); other "
                         "aggregations would be ignored")
