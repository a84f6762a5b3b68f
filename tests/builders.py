"""What the test modules build and share, one copy each: tiny models, arithmetic problems and traces, Rollouts
batches, probes, fast training settings, CLI subprocess helpers and the trust tests' helpers.

Test modules import these (`from builders import ...`); they never import each other. The fixtures built from
them (hf_policy, gym_task, hf_setup, hf_dir, policy, saved_policy) are in conftest.py. Imports of optional or
heavy stacks (transformers' tokenizers, verl, the show page) are made inside the builder that needs them.

Shapes: B rows (traces), P prompt tokens, T completion tokens; Rollouts hold prompt_ids/prompt_mask [B, P],
completion_ids/completion_mask/old_logprobs [B, T], group/rewards/correct [B].
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
import sys
import threading

import torch

from credo import credit
from credo.cli.main import main
from credo.core.probe import Probe
from credo.core.rollouts import Rollouts, concat_rollouts
from credo.core.protocols import Problem, SamplingConfig, rewards_for
from credo.policy.gpt import GPTConfig
from credo.policy.tiny import TinyPolicy
from credo.tasks.arith import ArithTask
from credo.train.sft import make_tokenizer
from credo.train.plan import load_train_config
from credo.train.trainer import Trainer

# --- tiny models ------------------------------------------------------------------------------------------


def tiny_policy(seed: int = 0, d_model: int = 32, n_layer: int = 2) -> TinyPolicy:
    """A TinyPolicy (credo's own GPT, 2 heads, 128 positions) over the arithmetic tokenizer, seeded."""
    tok = make_tokenizer()
    return TinyPolicy.create(GPTConfig(vocab_size=tok.vocab_size, n_layer=n_layer, d_model=d_model, n_head=2,
                                       max_len=128), tok, seed=seed)


CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def build_tokenizer():
    """A byte-level BPE tokenizer (300 tokens, trained here on a few arithmetic sentences, no hub access) as a
    transformers PreTrainedTokenizerFast with <eos>/<pad>/<unk> and a chat template (CHAT_TEMPLATE)."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ["State the final answer to the following arithmetic problem: 4 - 1 - 7 =",
              "Let me add. So 3 + 4 = 7. Wait, check. Therefore <answer>7</answer>",
              "The final answer is \\boxed{12}. Step 1: 2 + 3 = 5\n\nStep 2: 5 * 2 = 10"] * 20
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<pad>", "<eos>", "<|user|>",
                                                                  "<|assistant|>", "<|system|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>",
                                                unk_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_llama(tokenizer, hidden_size: int = 32, max_positions: int = 512, init_range: float = 0.02):
    """A 2-layer Llama built from a config (no hub), seeded: the same weights on every call."""
    import transformers
    config = transformers.LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden_size,
                                      intermediate_size=2 * hidden_size, num_hidden_layers=2, num_attention_heads=2,
                                      num_key_value_heads=2, max_position_embeddings=max_positions,
                                      pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                                      initializer_range=init_range)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def save_tiny_llama(path: str, **llama_options) -> str:
    """tiny_llama (with `llama_options`) and build_tokenizer saved as a credo HF checkpoint (chat) at `path`."""
    from credo.policy.hf import HFPolicy
    tokenizer = build_tokenizer()
    HFPolicy(tiny_llama(tokenizer, **llama_options), tokenizer, chat=True).save(path)
    return path


def shipped_start() -> str:
    """The shipped arith SFT start (a TinyPolicy that writes arithmetic), unpacked into the test's cache."""
    from credo.train.sft import ensure_sft
    return ensure_sft(task="arith", progress=False)


# --- arithmetic problems and traces -----------------------------------------------------------------------

ADDITION = Problem("37+48", "37+48\n", "85", {"terms": [37, 48], "ops": ["+"]})
THREE_TERMS = Problem("12+13+14", "12+13+14\n", "39", {"terms": [12, 13, 14], "ops": ["+", "+"]})
CHAIN = Problem("3+4+5+6+7", "3+4+5+6+7\n", "25", {"terms": [3, 4, 5, 6, 7], "ops": ["+", "+", "+", "+"]})
CHAIN_TEXTS = ["3+4=7\n7+5=12\n12+6=18\n18+7=25\n#### 25", "3+4=8\n8+5=13\n13+6=19\n19+7=26\n#### 26",
               "3+4=7\n7+5=12\n12+6=17\n17+7=24\n#### 24", "#### 25", "3+4=7\n7+5=11\n#### 11",
               "3+4=7\n7+5=12\n12+6=18\n18+7=25\n#### 25"]  # of CHAIN; two correct: SC-GRPO gives token weights


# --- Rollouts batches -------------------------------------------------------------------------------------


def rollouts_of(policy, task, texts, problem=ADDITION, groups=None) -> Rollouts:
    """`texts` as completions of `problem` (B = len(texts) rows), rewarded by `task`; group [B] from `groups`
    (default: one group 0); old_logprobs [B, T] zeros (nothing scored)."""
    prompt_ids, prompt_mask = policy.encode_prompts([problem.prompt] * len(texts))
    ids, mask = policy.encode_completions(texts)
    rewards, correct = rewards_for(task, [problem] * len(texts), texts)
    group = torch.tensor(groups if groups is not None else [0] * len(texts), dtype=torch.long)
    return Rollouts(prompt_ids, prompt_mask, ids, mask, group, rewards, torch.zeros(ids.shape), correct,
                    [problem] * len(texts), list(texts))


def scored_rollouts(policy, task, problems, texts, groups=None) -> Rollouts:
    """Row i: completion texts[i] of problems[i] in group groups[i] (default all 0), rewarded by `task`, with
    old_logprobs [B, T] the policy's own scores of the completions."""
    problems, texts = list(problems), list(texts)
    prompt_ids, prompt_mask = policy.encode_prompts([p.prompt for p in problems])
    ids, mask = policy.encode_completions(texts)
    rewards, correct = rewards_for(task, problems, texts)
    with torch.no_grad():
        old, _ = policy.score(prompt_ids, prompt_mask, ids, mask)
    group = torch.tensor(groups if groups is not None else [0] * len(texts), dtype=torch.long)
    return Rollouts(prompt_ids, prompt_mask, ids, mask, group, rewards, old, correct, problems, texts)


def two_group_batch(policy, task) -> Rollouts:
    """6 scored rows, two groups of 3: ADDITION (right, wrong, answer only: rewards 1, 0, 1) and THREE_TERMS
    (right, wrong last step, cut short: rewards 1, 0, 0)."""
    rows = [(ADDITION, "37+48=85\n#### 85", 0), (ADDITION, "37+48=86\n#### 86", 0), (ADDITION, "#### 85", 0),
            (THREE_TERMS, "12+13=25\n25+14=39\n#### 39", 1), (THREE_TERMS, "12+13=25\n25+14=38\n#### 38", 1),
            (THREE_TERMS, "12+13=26\n", 1)]
    problems, texts, groups = zip(*rows)
    return scored_rollouts(policy, task, problems, texts, list(groups))


def padded_rollouts(rewards, group, lengths, T: int = 6) -> Rollouts:
    """Reward-only rows without a model: B = len(rewards) rows of token 5, row i real for its first lengths[i]
    of T tokens (completion_mask [B, T]), prompts [B, 2] of ones, old_logprobs [B, T] zeros."""
    B = len(rewards)
    mask = torch.zeros(B, T, dtype=torch.bool)
    for i, n in enumerate(lengths):
        mask[i, :n] = True
    return Rollouts(prompt_ids=torch.ones(B, 2, dtype=torch.long), prompt_mask=torch.ones(B, 2, dtype=torch.bool),
                    completion_ids=torch.where(mask, 5, 0), completion_mask=mask,
                    group=torch.tensor(group), rewards=torch.tensor(rewards, dtype=torch.float32),
                    old_logprobs=torch.zeros(B, T), correct=torch.tensor(rewards) > 0.5)


def token_rollouts(ids, mask, group, rewards) -> Rollouts:
    """Rollouts of completion ids [B, T] / mask [B, T] as given, group [B], rewards [B] (correct = reward
    > 0.5), behind one-token prompts [B, 1]; old_logprobs [B, T] zeros; no problems or texts."""
    B = ids.shape[0]
    return Rollouts(torch.zeros(B, 1, dtype=torch.long), torch.ones(B, 1, dtype=torch.bool), ids, mask, group,
                    rewards, torch.zeros(ids.shape), rewards > 0.5)


def audit_cache_entry(tmp_path):
    """An audit cache entry saved under tmp_path/cache/audit/abc.{json,safetensors}: 4 rows [4, 5] of two
    held-out arith problems, zero segments, a random MC reference, trace tokens 7.5.
    -> (stem, problems, rollouts, reference)."""
    from credo.core.values import MCValues
    from credo.lab.audit.cache import save_cached
    from credo.tasks import make_task
    task = make_task("arith")
    problems = task.heldout_problems(2)
    B, T = 4, 5
    rollouts = Rollouts(prompt_ids=torch.ones(B, 3, dtype=torch.long), prompt_mask=torch.ones(B, 3, dtype=torch.bool),
                        completion_ids=torch.arange(B * T).view(B, T),
                        completion_mask=torch.ones(B, T, dtype=torch.bool),
                        group=torch.tensor([0, 0, 1, 1]), rewards=torch.tensor([1.0, 0.0, 0.0, 1.0]),
                        old_logprobs=torch.randn(B, T), correct=torch.tensor([True, False, False, True]),
                        problems=[problems[g] for g in (0, 0, 1, 1)], completions=["a", "b", "c", "d"])
    segments = torch.zeros(B, T, dtype=torch.long)
    reference = MCValues([torch.rand(3) for _ in range(B)], [torch.rand(2, 4) for _ in range(B)])
    stem = str(tmp_path / "cache" / "audit" / "abc")
    save_cached(stem, rollouts, segments, reference, {"tokens_scored_per_trace": 1.0}, 7.5)
    return stem, problems, rollouts, reference


# --- probes -----------------------------------------------------------------------------------------------


def probe_for(policy, task, seed: int = 0, max_new_tokens: int = 12) -> Probe:
    """A Probe of `policy` on `task` sampling up to `max_new_tokens`, its generator seeded with `seed`."""
    return Probe(policy, task, SamplingConfig(max_new_tokens=max_new_tokens), torch.Generator().manual_seed(seed))


# --- estimators on one small policy (the property tests) --------------------------------------------------

PROPERTY_POLICY = tiny_policy(d_model=16, n_layer=1)
PROPERTY_TASK = ArithTask()
PROPERTY_PROBLEMS = [ADDITION, THREE_TERMS]
# the cheapest settings of the model-based estimators: properties, not quality, are under test
CHEAP = {"vineppo": {"k": 2}, "spo_chain": {"k": 2}, "shapley": {"permutations": 2}, "ibpo": {"repair_tries": 1}}


def text_rollouts(texts, rewards, groups) -> Rollouts:
    """Row i: texts[i] as a completion of PROPERTY_PROBLEMS[groups[i] % 2] with the reward rewards[i] as given
    (correct = reward > 0.5), group groups[i]; old_logprobs [B, T] scored by PROPERTY_POLICY."""
    problems = [PROPERTY_PROBLEMS[g % len(PROPERTY_PROBLEMS)] for g in groups]
    prompt_ids, prompt_mask = PROPERTY_POLICY.encode_prompts([p.prompt for p in problems])
    ids, mask = PROPERTY_POLICY.encode_completions(texts)
    with torch.no_grad():
        old, _ = PROPERTY_POLICY.score(prompt_ids, prompt_mask, ids, mask)
    r = torch.tensor(rewards, dtype=torch.float32)
    return Rollouts(prompt_ids, prompt_mask, ids, mask, torch.tensor(groups), r, old, r > 0.5, problems, list(texts))


def run_estimator(name, rollouts, **options):
    """The registered estimator `name` on `rollouts` with its CHEAP settings updated by `options`, probing
    PROPERTY_POLICY on PROPERTY_TASK (6 new tokens, seed 0). -> its Credit."""
    spec = credit.get(name)
    probe = Probe(PROPERTY_POLICY, PROPERTY_TASK, SamplingConfig(max_new_tokens=6), torch.Generator().manual_seed(0))
    return spec(rollouts, probe, spec.make_config({**CHEAP.get(name, {}), **options}))


# --- a chat model on gym:chain_sum, and the DataProto verl would hold -------------------------------------

CHAIN_SUM_OPTIONS = {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1}
WIDE_INIT = 0.5  # initializer_range of the hf_setup model (conftest.py)


def chain_sum_rollouts(policy, task) -> Rollouts:
    """4 groups of 4 (B = 16, old_logprobs scored by `policy`): mixed correct/wrong (SC-GRPO's weighted
    route), all wrong (its diversity route), written texts plus completions sampled from the model."""
    problems = task.train_problems(4, torch.Generator().manual_seed(0))
    rows, texts = [], []
    for k, p in enumerate(problems):
        if k == 2:
            group = ["Wait. <answer>0</answer>", "no idea", "Let me add. So it is 5.", "<answer>100</answer>"]
        else:
            group = [f"Let me add. So it is {p.answer}. <answer>{p.answer}</answer>", "Wait. <answer>0</answer>",
                     f"Therefore\n\n<answer>{p.answer}</answer>", None]
        for text in group:
            rows.append(p)
            texts.append(text)
    p_ids, p_mask = policy.encode_prompts([p.prompt for p in rows])
    sampled = policy.sample(p_ids, p_mask, SamplingConfig(max_new_tokens=10), torch.Generator().manual_seed(1))
    written = [policy.encode_continuation(t, eos=True) if t is not None else None for t in texts]
    parts = []
    for i, ids in enumerate(written):
        c_ids = torch.tensor([ids]) if ids is not None else sampled.completion_ids[i:i + 1]
        c_mask = torch.ones_like(c_ids, dtype=torch.bool) if ids is not None else sampled.completion_mask[i:i + 1]
        text = policy.decode(c_ids[0][c_mask[0]])
        r, ok = rewards_for(task, [rows[i]], [text])
        with torch.no_grad():
            old, _ = policy.score(p_ids[i:i + 1], p_mask[i:i + 1], c_ids, c_mask)
        parts.append(Rollouts(p_ids[i:i + 1], p_mask[i:i + 1], c_ids, c_mask, torch.tensor([i // 4]), r, old, ok,
                              [rows[i]], [text]))
    return concat_rollouts(parts, policy.pad_id)


def to_dataproto(r, task, order):
    """The DataProto verl would hold for these rollouts, rows in `order` (balance_batch reorders): tensors
    [B, P] / [B, T] / [B, P + T], token_level_scores [B, T] holding each reward at its row's last token."""
    import numpy as np
    from verl import DataProto
    from credo.integrations.verl_credit import dataset_row
    mask = r.completion_mask.long()
    scores = torch.zeros(mask.shape)
    last = (mask.sum(1) - 1).clamp(min=0)
    scores[torch.arange(len(last)), last] = r.rewards
    attention = torch.cat([r.prompt_mask.long(), mask], 1)
    tensors = {"prompts": r.prompt_ids, "responses": r.completion_ids, "response_mask": mask,
               "input_ids": torch.cat([r.prompt_ids, r.completion_ids], 1), "attention_mask": attention,
               "position_ids": (attention.cumsum(1) - 1).clamp(min=0), "token_level_scores": scores,
               "token_level_rewards": scores.clone(), "old_log_probs": r.old_logprobs,
               "credo_group": r.group}  # global group ids, as credit_on_shards sets them (SC-GRPO seeds by group)
    extra = np.array([dataset_row(task, p)["extra_info"] for p in r.problems], dtype=object)
    uid = np.array([f"uid-{g}" for g in r.group.tolist()], dtype=object)
    batch = DataProto.from_dict(tensors={k: v[order] for k, v in tensors.items()},
                                non_tensors={"uid": uid[order.numpy()], "extra_info": extra[order.numpy()]})
    return batch


def shuffled_order(n, seed=0):
    """A seeded permutation of range(n), [n]."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))


class ThreadGather:
    """Probe.gather across `world` threads (one per simulated data-parallel shard)."""

    def __init__(self, world):
        # a timeout: a shard that skips a collective breaks the barrier (a test failure) instead of hanging
        self.slots, self.barrier = [None] * world, threading.Barrier(world, timeout=120)

    def for_rank(self, rank):
        def gather(values):
            self.slots[rank] = values
            self.barrier.wait()
            out = torch.cat(list(self.slots))
            self.barrier.wait()
            return out
        return gather


# --- the credo show page ----------------------------------------------------------------------------------


def page_of(policy, methods=("grpo", "rredcot:mode=replace"), with_reference=True):
    """The `credo show` page of CHAIN_TEXTS (rows 0, 1, 2, 4 shown) under `methods`, segmented by lines, with a
    linearly falling MC reference (or none)."""
    from credo.lab.show.view import build_page, run_methods
    task = ArithTask()
    rollouts = rollouts_of(policy, task, CHAIN_TEXTS, CHAIN)
    segment_ids = probe_for(policy, task).segment(rollouts, "lines")
    runs = run_methods(methods, rollouts, policy, task, SamplingConfig(max_new_tokens=12), 0, progress=False)
    rows = [0, 1, 2, 4]
    reference = [torch.linspace(0.5, 0.0, int(segment_ids[r].max()) + 2) for r in rows] if with_reference else None
    return build_page("credo show", "test", task, policy, rollouts, segment_ids, rows, runs, reference, 3.0)


# --- short training runs ----------------------------------------------------------------------------------

TRAIN_FAST = ["eval_n=8", "final_eval_n=8", "eval_every=2", "checkpoint_every=2", "prompts_per_step=3",
              "group_size=4", "sampling.max_new_tokens=20", "overlong_buffer=12", "overlong_fit_task=false", "lr=1e-3"]


def dapo_config(start, *extra):
    """A 4-step dapo TrainConfig from `start` with TRAIN_FAST settings, then `extra` ("key=value")."""
    # dapo's overlong penalty varies the reward even for an untrained model, so updates are non-trivial
    return load_train_config(None, ["method=dapo", f"start={start}", "steps=4", *TRAIN_FAST, *extra])


def strip_time(rows):
    """Metric rows without their wall-clock "seconds"."""
    return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]


# --- `credo train` in a subprocess (kill -9, resume) ------------------------------------------------------

def subprocess_env() -> dict[str, str]:
    """The environment of a `credo` subprocess: this test's (its isolated CREDO_CACHE included), one thread."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


SUBPROCESS_SETTINGS = ["eval_n=2", "final_eval_n=4", "eval_every=2", "checkpoint_every=1", "keep_checkpoints=2",
                       "prompts_per_step=2", "group_size=3", "sampling.max_new_tokens=12", "lr=1e-3"]


def train_command(start: str, out: str, method: str, steps: int, extra: list[str]) -> list[str]:
    """argv of `python -m credo.cli train` with SUBPROCESS_SETTINGS and `extra` as --set options."""
    sets = sum((["--set", s] for s in SUBPROCESS_SETTINGS + extra), [])
    return [sys.executable, "-m", "credo.cli", "train", "--method", method, "--start", start, "--steps", str(steps),
            "--out", out, "--quiet", *sets]


def steps_logged(run_dir: str) -> int:
    """Complete lines of run_dir/metrics.jsonl less one (the config line); -1 before the file exists."""
    try:
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            return sum(1 for line in f if line.endswith("\n")) - 1
    except FileNotFoundError:
        return -1


def resume_run(run_dir: str) -> None:
    """`credo train --resume run_dir` in a subprocess; asserts it exits 0."""
    done = subprocess.run([sys.executable, "-m", "credo.cli", "train", "--resume", run_dir, "--quiet"],
                          env=subprocess_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def logged_metrics(run_dir: str) -> list[dict]:
    """run_dir/metrics.jsonl's rows without their wall-clock "seconds"."""
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    return strip_time(rows)


# --- the trust tests: a malicious pickle, directory snapshots, one-line CLI errors, tiny runs --------------

TRUST_FAST = ["eval_n=4", "final_eval_n=4", "eval_every=2", "checkpoint_every=2", "prompts_per_step=2",
              "group_size=3", "sampling.max_new_tokens=12", "lr=1e-3"]
TRUST_FAST_SET = sum((["--set", s] for s in TRUST_FAST), [])  # TRUST_FAST as CLI options


class Payload:
    """Unpickling this runs a shell command that creates `marker`: what a crafted run directory could do."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def malicious_pickle(path: str, marker: str) -> None:
    """A pickle of Payload(marker) at `path`."""
    with open(path, "wb") as f:
        pickle.dump(Payload(marker), f)


def payload_is_live(tmp_path) -> bool:
    """The payload really executes when unpickled (so a test that it was not executed means something)."""
    marker = str(tmp_path / "live-check")
    malicious_pickle(str(tmp_path / "live.pkl"), marker)
    with open(tmp_path / "live.pkl", "rb") as f:
        pickle.load(f)  # noqa: S301 - deliberately, on our own file
    live = os.path.exists(marker)
    os.remove(marker)
    return live


def snapshot(root: str) -> dict[str, str]:
    """relative path -> sha256 of every file under root (directories as '<dir>')."""
    out = {}
    for base, dirs, files in os.walk(root):
        for d in dirs:
            out[os.path.relpath(os.path.join(base, d), root)] = "<dir>"
        for name in files:
            path = os.path.join(base, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return out


def one_line_error(capsys, argv: list[str]) -> str:
    """Run the CLI; assert it failed as a user error (exit 2, exactly one line on stderr); return that line."""
    capsys.readouterr()
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    lines = [line for line in err if not line.startswith(("jsonl task: skipped",))]
    assert code == 2, f"exit {code}, stderr {err}"
    assert len(lines) == 1, f"expected one line, got {err}"
    assert lines[0].startswith(f"credo {argv[0]}: error: ")
    return lines[0]


def train_config(start: str, *extra: str):
    """A 4-step grpo TrainConfig from `start` with TRUST_FAST settings, then `extra` ("key=value")."""
    return load_train_config(None, ["method=grpo", f"start={start}", "steps=4", *TRUST_FAST, *extra])


def killed_run(start: str, run_dir: str, *extra: str, stop_after: int = 3) -> Trainer:
    """A run that stopped after `stop_after` steps (checkpoint at step 2, no final/)."""
    trainer = Trainer(train_config(start, *extra), run_dir, progress=False)
    trainer.train(stop_after=stop_after)
    return trainer
