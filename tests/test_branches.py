"""Packed branch scoring (credo.policy.branches): bins of one row each, and the same log-probs as re-reading
every prefix, whatever the bin size."""

import pytest
import torch

from credo.policy.base import score_branches_by_rescoring
from credo.policy.branches import pack_branches, score_packed_branches


def test_bins_hold_one_row_each_fill_first_fit_decreasing_and_never_split_a_branch():
    rows, lengths = [0, 0, 0, 1, 0, 1, 0], [5, 4, 3, 8, 2, 1, 6]
    packing = pack_branches(rows, lengths, bin_tokens=10)
    assert packing.width == 10
    # row 0, longest first: 6 opens bin 0, 5 opens bin 1, 4 fits bin 0, 3 and 2 fit bin 1 (first with room);
    # row 1: 8 opens bin 2, 1 joins it
    assert packing.placement == [(1, 0), (0, 6), (1, 5), (2, 0), (1, 8), (2, 8), (0, 0)]
    assert packing.bin_row == [0, 0, 1]
    for (b, start), row, n in zip(packing.placement, rows, lengths):
        assert packing.bin_row[b] == row and start + n <= packing.width


def test_a_branch_longer_than_a_bin_widens_the_bins():
    packing = pack_branches([0, 1], [3, 12], bin_tokens=4)
    assert packing.width == 12 and packing.placement == [(0, 0), (1, 0)]


@pytest.mark.parametrize("bin_tokens", [1, 4, 128])
def test_packed_scores_equal_rescoring_each_prefix_at_any_bin_size(policy, bin_tokens):
    prompt_ids, prompt_mask = policy.encode_prompts(["37+48\n", "5+6+7\n", "9-2\n"])
    comp_ids, comp_mask = policy.encode_completions(["37+48=85\n#### 85", "5+6=11\n", "9-2=7\n#### 7"])
    enc = policy.tokenizer.encode
    branches = [(0, 0, enc("?85", eos=True)), (0, 9, enc("48=85\n", eos=True)), (0, 9, enc("?8", eos=True)),
                (1, 3, enc("?85", eos=True)), (1, 7, [5]), (2, 4, enc("7\n#### 7", eos=True)),
                (2, 0, enc("9", eos=False))]
    policy.model.eval()
    seq = torch.cat([prompt_ids, comp_ids], 1)
    mask = torch.cat([prompt_mask, comp_mask], 1)
    packed = score_packed_branches(policy.model, seq, mask, prompt_ids.shape[1], branches, policy.pad_id, bin_tokens)
    reread, _ = score_branches_by_rescoring(policy, prompt_ids, prompt_mask, comp_ids, branches)
    assert [len(p) for p in packed] == [len(t) for _, _, t in branches]
    for a, b in zip(packed, reread):
        assert torch.allclose(a, b, atol=1e-5)
