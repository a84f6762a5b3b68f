"""SRPO's prompt localiser end to end through the Hugging Face backend (tiny random Llama, no hub)."""

import random

import torch

from credo.policy import bind_task
from credo.core.protocols import SamplingConfig
from credo.core.probe import Probe
from credo import strategies
from credo.strategies import SamplingContext
from credo.strategies.localisers import localise
from credo.strategies.resets import ResetConfig


class Recorder:
    """Delegates to a policy; records what the localiser encodes and how it samples. With `reply`,
    every sampled completion is that text (a stand-in for an instruction-following model)."""

    def __init__(self, inner, reply=None):
        self.inner, self.reply, self.formatted, self.samplings = inner, reply, [], []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def encode_prompts(self, texts, system=True):
        self.formatted += [self.inner.format_prompt(t, system) for t in texts]
        return self.inner.encode_prompts(texts, system)

    def sample(self, ids, mask, sampling, generator):
        self.samplings.append(sampling)
        out = self.inner.sample(ids, mask, sampling, generator)
        if self.reply is None:
            return out
        c_ids, c_mask = self.inner.encode_completions([self.reply] * ids.shape[0])
        return type(out)(c_ids, c_mask, torch.zeros(c_ids.shape))


def wrong_three_step_rollouts(policy, task, texts=("Let me add.\nSo it is 1000.\n<answer>1000</answer>",) * 2):
    from credo.core.rollouts import Rollouts
    from credo.core.protocols import rewards_for
    problems = task.train_problems(2, torch.Generator().manual_seed(0))
    texts = list(texts)
    p_ids, p_mask = policy.encode_prompts([p.prompt for p in problems])
    ids, mask = policy.encode_completions(texts)
    rewards, correct = rewards_for(task, problems, texts)
    assert not correct.any()
    return Rollouts(p_ids, p_mask, ids, mask, torch.arange(2), rewards, torch.zeros(ids.shape),
                    correct, problems, texts)


def test_prompt_localiser_sends_a_bare_user_turn_and_parses_the_reply(hf_policy, gym_task):
    policy = Recorder(bind_task(hf_policy.copy(), gym_task),
                      reply="Step 3 is where it shows, but Step 2 starts it.\n\\boxed{2}")
    assert policy.system_prompt  # the task's answer-format system prompt is bound...
    r = wrong_three_step_rollouts(policy.inner, gym_task)
    probe = Probe(policy, gym_task, SamplingConfig(top_p=0.9, max_new_tokens=6), torch.Generator().manual_seed(0))
    seg = probe.segment(r, "lines")
    rows = list(range(r.batch_size))
    assert [int(seg[i].max()) + 1 for i in rows] == [3, 3]
    with probe.metered() as spent:
        picks = localise("prompt", r, rows, probe, seg, random.Random(0), prompt_temperature=0.3,
                         prompt_max_new_tokens=77)
    assert picks == [1] * len(rows)  # \boxed{2}, 0-based
    # the srpo recipe asks too
    assert localise("self", r, rows, probe, seg, random.Random(0), 0.3, prompt_max_new_tokens=77) == picks
    asked = policy.formatted[-len(rows):]
    assert all("<|system|>" not in t and t.startswith("<|user|>") for t in asked)  # ...but not sent here
    assert all("Find the originating step, not just the symptom" in t and "\\boxed{N}" in t for t in asked)
    assert policy.samplings[-1] == SamplingConfig(0.3, 0.9, 77)
    assert spent.tokens_generated > 0
    asked_before = len(policy.samplings)  # no wrong trace to localise: no request, no sampling of an empty batch
    assert localise("prompt", r, [], probe, seg, random.Random(0), 0.3, prompt_max_new_tokens=77) == []
    assert len(policy.samplings) == asked_before


def test_srpo_with_the_prompt_localiser_collects_resets_on_a_tiny_chat_model(hf_policy, gym_task):
    policy = Recorder(bind_task(hf_policy.copy(), gym_task))
    sampling = SamplingConfig(max_new_tokens=8)
    probe = Probe(policy, gym_task, sampling, torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(0)
    config = ResetConfig(localiser="prompt", segmenter="keyword_entropy",
                         prompt_max_new_tokens=12, max_fresh_attempts=6)
    ctx = SamplingContext(policy, gym_task, lambda n: gym_task.train_problems(n, g), sampling,
                          torch.Generator().manual_seed(1), probe, random.Random(0))
    out = strategies.make("resets", config).collect(ctx, 2)
    assert out.details["parents"]  # a random model fails: every prompt finds a parent
    assert any(s.max_new_tokens == 12 and s.temperature == 0.3 for s in policy.samplings)
    assert out.cost.tokens_generated > 0  # the localisation replies are counted, as the strategy's cost
    groups = {2 * q for q in range(2)} | {2 * q + 1 for q in out.details["parents"]}
    assert set(out.rollouts.group.tolist()) == groups


def test_a_request_longer_than_the_context_is_not_sent_and_resets_at_step_1(hf_policy, gym_task):
    """A localisation request the model cannot read whole (a long trace on the tiny GPT's 256 positions crashed two
    srpo:localiser=prompt runs of compare-long-skilled) gets the empty reply: the parser's step-1 fallback."""
    from credo.strategies.localisers import localisation_requests
    policy = Recorder(bind_task(hf_policy.copy(), gym_task), reply="\\boxed{2}")
    texts = [f"Let me add{more}.\nSo it is 1000.\n<answer>1000</answer>" for more in (" them all up", "")]
    r = wrong_three_step_rollouts(policy.inner, gym_task, texts)
    probe = Probe(policy, gym_task, SamplingConfig(max_new_tokens=6), torch.Generator().manual_seed(0))
    seg = probe.segment(r, "lines")
    rows = list(range(r.batch_size))
    lengths = [int(n) for n in policy.inner.encode_prompts(localisation_requests(r, rows, probe, seg),
                                                           system=False)[1].sum(dim=1)]
    assert lengths[0] > lengths[1]  # the first trace's request is longer: the row left out comes first
    longest = lengths.index(max(lengths))

    policy.clamps_generation = True  # as the tiny GPT, which cannot read past its context

    def ask(context):
        policy.context_length, policy.samplings = context, []
        picks = localise("prompt", r, rows, probe, seg, random.Random(0), 0.3, prompt_max_new_tokens=5)
        return picks, len(policy.samplings)

    assert ask(max(lengths) + 1) == ([1, 1], 1)  # both fit: both asked, \boxed{2}
    assert ask(min(lengths)) == ([0, 0], 0)  # neither leaves room for a reply: nothing sampled, step 1 for both
    picks, calls = ask(max(lengths))  # only the shorter request is sent
    assert calls == 1 and picks[longest] == 0 and picks[1 - longest] == 1
