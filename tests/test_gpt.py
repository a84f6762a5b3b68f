import torch

from credo.core.protocols import SamplingConfig, left_pad


def test_kv_cache_logits_equal_full_recomputation(policy):
    model = policy.model.eval()
    prompts = [[1, 5, 6, 7, 8], [1, 9, 4], [1, 3]]
    ids, mask = left_pad(prompts, 0)
    g = torch.Generator().manual_seed(0)
    new = torch.randint(3, policy.tokenizer.vocab_size, (3, 6), generator=g)
    with torch.no_grad():
        cache = model.new_cache(3, 32)
        stepwise = [model(ids, mask, cache)[:, -1]]
        for t in range(new.shape[1]):
            stepwise.append(model(new[:, t:t + 1], torch.ones(3, 1, dtype=torch.bool), cache)[:, -1])
        full = model(torch.cat([ids, new], 1), torch.cat([mask, torch.ones_like(new, dtype=torch.bool)], 1))
    P = ids.shape[1]
    for t, logits in enumerate(stepwise):
        assert torch.allclose(logits, full[:, P - 1 + t], atol=1e-5)


def test_left_padding_does_not_change_a_row(policy):
    model = policy.model.eval()
    alone, m1 = left_pad([[1, 5, 6]], 0)
    padded, m2 = left_pad([[1, 5, 6], [1, 4, 4, 4, 4, 4]], 0)
    with torch.no_grad():
        a = model(alone, m1)[0, -1]
        b = model(padded, m2)[0, -1]
    assert torch.allclose(a, b, atol=1e-5)


def test_sampling_stops_at_eos_and_scores_match(policy):
    ids, mask = policy.encode_prompts(["12+13\n", "4+5\n"])
    out = policy.sample(ids, mask, SamplingConfig(max_new_tokens=20), torch.Generator().manual_seed(1))
    for row, m in zip(out.completion_ids, out.completion_mask):
        n = int(m.sum())
        assert (row[n:] == policy.pad_id).all()
        assert policy.eos_id not in row[:max(n - 1, 0)].tolist()
    with torch.no_grad():
        lp, ent = policy.score(ids, mask, out.completion_ids, out.completion_mask, entropy=True)
    assert torch.allclose(lp, out.logprobs, atol=1e-5)
    assert (lp[~out.completion_mask] == 0).all() and (ent[~out.completion_mask] == 0).all()


def test_sampler_never_emits_teacher_only_markers(policy):
    with torch.no_grad():
        policy.model.tok_emb.weight[policy.tokenizer.char_to_id["?"]] *= 50  # make the marker very likely
    ids, mask = policy.encode_prompts(["12+13\n"] * 16)
    out = policy.sample(ids, mask, SamplingConfig(max_new_tokens=10), torch.Generator().manual_seed(0))
    banned = set(policy.tokenizer.banned_ids)
    assert not banned & set(out.completion_ids[out.completion_mask].tolist())


def test_greedy_sampling_is_deterministic_and_seeded_sampling_repeats(policy):
    ids, mask = policy.encode_prompts(["12+13\n"] * 4)
    a = policy.sample(ids, mask, SamplingConfig(max_new_tokens=8), torch.Generator().manual_seed(3))
    b = policy.sample(ids, mask, SamplingConfig(max_new_tokens=8), torch.Generator().manual_seed(3))
    assert torch.equal(a.completion_ids, b.completion_ids)
    g = policy.sample(ids, mask, SamplingConfig(temperature=0, max_new_tokens=8), torch.Generator())
    assert all(torch.equal(g.completion_ids[0], row) for row in g.completion_ids)


def test_branch_scoring_with_prefix_reuse_equals_rescoring_each_prefix(policy):
    prompt_ids, prompt_mask = policy.encode_prompts(["37+48\n", "5+6+7\n"])
    comp_ids, comp_mask = policy.encode_completions(["37+48=85\n#### 85", "5+6=11\n"])
    q = policy.tokenizer.encode("?85", eos=True)
    branches = [(0, 0, q), (0, 9, q), (0, 9, policy.tokenizer.encode("?8", eos=True)), (1, 3, q), (1, 7, [5])]
    policy.model.eval()
    fast, cost_fast = policy.score_branches(prompt_ids, prompt_mask, comp_ids, comp_mask, branches, True)
    slow, cost_slow = policy.score_branches(prompt_ids, prompt_mask, comp_ids, comp_mask, branches, False)
    for a, b in zip(fast, slow):
        assert torch.allclose(a, b, atol=1e-5)
    # reuse: each row forwarded once plus every branch token; no reuse: each branch re-reads its prefix
    real = int(prompt_mask.sum() + comp_mask.sum())
    assert cost_fast == real + sum(len(t) for _, _, t in branches)
    def prefix(r, c):
        return int(prompt_mask[r].sum()) + c
    assert cost_slow == sum(prefix(r, c) + len(t) for r, c, t in branches)
