import pytest
import torch

from credo.core.segment import (SegmentInputs, SegmenterConfig, broadcast_segments, segment, segment_bounds,
                                segment_means)


def inputs(texts, eos=True, logprobs=None, entropies=None):
    strings = [list(t) + ([""] if eos else []) for t in texts]
    T = max(len(s) for s in strings)
    mask = torch.zeros(len(strings), T, dtype=torch.bool)
    for i, s in enumerate(strings):
        mask[i, :len(s)] = True
    return SegmentInputs(strings, mask, logprobs, entropies)


def spans(text, ids_row):
    chars = list(text) + [""]
    out = {}
    for c, s in zip(chars, ids_row.tolist()):
        out.setdefault(s, []).append(c)
    return ["".join(v) for k, v in sorted(out.items()) if k >= 0]


def test_lines_cuts_after_each_newline_and_keeps_eos_with_the_last_line():
    text = "37+48=85\n85-12=73\n#### 73"
    ids = segment(inputs([text]), "lines")
    assert spans(text, ids[0]) == ["37+48=85\n", "85-12=73\n", "#### 73"]
    # a trailing newline before EOS does not make an EOS-only segment
    ids = segment(inputs(["ab\n"]), "lines")
    assert ids[0].tolist() == [0, 0, 0, 0]


def test_edge_cases_empty_single_token_no_delimiter_and_padding():
    inp = inputs(["", "x", "no delimiter here"], eos=False)
    ids = segment(inp, "lines")
    assert (ids[0] == -1).all()
    assert ids[1].tolist()[0] == 0 and (ids[1, 1:] == -1).all()
    assert set(ids[2][inp.completion_mask[2]].tolist()) == {0}
    assert (ids[~inp.completion_mask] == -1).all()


def test_multi_token_delimiter_across_tokens():
    strings = [["a", ".\n", "\nb", "c", ""]]  # BPE-like tokens straddling the "\n\n" delimiter
    mask = torch.ones(1, 5, dtype=torch.bool)
    ids = segment(SegmentInputs(strings, mask), SegmenterConfig(name="lines", delimiter="\n\n"))
    assert ids[0].tolist() == [0, 0, 0, 1, 1]


def test_fixed_and_cutpoints():
    ids = segment(inputs(["abcdefg"], eos=False), SegmenterConfig(name="fixed", n=3))
    assert ids[0].tolist() == [0, 0, 0, 1, 1, 1, 2]
    lp = torch.log(torch.tensor([[0.99, 0.5, 0.99, 0.3, 0.99, 0.2, 0.95]]))
    ids = segment(inputs(["abcdefg"], eos=False, logprobs=lp), SegmenterConfig(name="cutpoints", p=0.9))
    assert ids[0].tolist() == [0, 1, 1, 2, 2, 3, 3]
    ids = segment(inputs(["abcdefg"], eos=False, logprobs=lp), SegmenterConfig(name="cutpoints", p=0.9, every=2))
    assert ids[0].tolist() == [0, 0, 0, 1, 1, 1, 1]


def test_keyword_entropy_limits_and_answer_segment():
    text = "Let me add.\n\nSo 3+4=7. Wait, check it. Therefore it is " + "x" * 40 + " The final answer is 7"
    cfg = SegmenterConfig(name="keyword_entropy", min_len=4, max_len=20, max_segments=8)
    ids = segment(inputs([text]), cfg)
    parts = spans(text, ids[0])
    assert parts[-1].startswith("The final answer")
    assert all(len(p) <= 20 for p in parts[:-1])
    assert all(len(p) >= 4 for p in parts[:-1])
    assert len(parts) <= 8
    assert any(p.startswith("So") for p in parts) or any(p.startswith("Wait") for p in parts)


def test_keyword_entropy_segment_longer_than_max_is_split():
    text = "y" * 50
    ids = segment(inputs([text], eos=False), SegmenterConfig(name="keyword_entropy", min_len=2, max_len=16))
    assert [len(p) for p in spans(text + "", torch.cat([ids[0], torch.tensor([-1])]))] == [16, 16, 16, 2]


def test_bounds_means_and_broadcast_roundtrip():
    ids = torch.tensor([[0, 0, 1, 1, 1, -1], [0, 1, 2, -1, -1, -1]])
    assert segment_bounds(ids) == [[(0, 2), (2, 5)], [(0, 1), (1, 2), (2, 3)]]
    values = [torch.tensor([1.0, -2.0]), torch.tensor([0.5, 0.0, 3.0])]
    dense = broadcast_segments(values, ids)
    assert dense[0].tolist() == [1, 1, -2, -2, -2, 0] and dense[1, 3:].abs().sum() == 0
    means = segment_means(dense, ids)
    assert all(torch.allclose(a, b) for a, b in zip(means, values))


def test_unknown_segmenter_is_named():
    with pytest.raises(ValueError, match="segmenter.name"):
        SegmenterConfig(name="sentences")
