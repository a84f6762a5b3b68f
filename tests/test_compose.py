"""One estimator built on another's credit (credo.credit.compose): `entropy_mask:of=`, `tempo:of=`, `shuffled:of=`."""

from __future__ import annotations

import pytest
import torch

from builders import PROPERTY_POLICY, run_estimator, text_rollouts
from credo import credit
from credo.credit.entropy import high_entropy_mask
from credo.train.methods import privileged

TEXTS = ["4+4=8\n8", "4+4=9\n9", "4+5=9\n9", "1+2=3\n3", "1+2=4\n4", "2+2=4\n4"]
REWARDS, GROUPS = [1.0, 0.0, 0.0, 1.0, 0.0, 0.0], [0, 0, 0, 1, 1, 1]


def test_entropy_mask_of_a_method_keeps_its_advantages_and_multiplies_its_weights_by_the_mask():
    r = text_rollouts(TEXTS, REWARDS, GROUPS)
    _, entropies = PROPERTY_POLICY.score(r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask, entropy=True)
    keep = high_entropy_mask(entropies, r.completion_mask, 0.2).float()
    for inner, options in (("rredcot", {}), ("lambda_grpo", {"lam": 0.5})):  # 0.5: not lambda_grpo's default
        base = run_estimator(inner, r, **options)
        masked = run_estimator("entropy_mask", r, of=inner, **options)
        assert torch.equal(masked.advantages, base.advantages)
        expected = keep if base.weights is None else base.weights * keep
        assert torch.equal(masked.weights, expected)
    assert masked.weights.count_nonzero() < base.weights.count_nonzero()  # the mask removed tokens


def test_tempo_of_grpo_is_tempo_and_of_another_method_adds_the_same_trie_term():
    r = text_rollouts(TEXTS, REWARDS, GROUPS)
    tempo, grpo = run_estimator("tempo", r).advantages, run_estimator("grpo", r).advantages
    assert torch.allclose(run_estimator("tempo", r, of="grpo").advantages, tempo, atol=1e-6)
    rredcot = run_estimator("rredcot", r)
    combined = run_estimator("tempo", r, of="rredcot")
    assert torch.allclose(combined.advantages, rredcot.advantages + (tempo - grpo), atol=1e-6)
    assert not torch.allclose(tempo, grpo)  # the trie term is not zero here, so the sum says something
    own = run_estimator("rredcot", r, include_reference=False)  # an option of the wrapped method reaches it
    combined = run_estimator("tempo", r, of="rredcot", include_reference=False)
    assert torch.allclose(combined.advantages, own.advantages + (tempo - grpo), atol=1e-6)
    assert combined.cost.tokens_scored == own.cost.tokens_scored > 0
    assert own.cost.tokens_scored < rredcot.cost.tokens_scored  # no reference tails were scored


def test_a_wrapper_is_privileged_exactly_when_the_method_it_wraps_is():
    assert privileged("tempo:of=rredcot") and privileged("entropy_mask:of=rredcot")
    assert not privileged("tempo:of=rredcot:include_reference=false")
    assert not privileged("entropy_mask:of=rredcot:include_reference=false")
    assert not privileged("tempo") and not privileged("entropy_mask")


@pytest.mark.parametrize("name, options, field", [
    ("entropy_mask", {"lam": 1.0}, "credit.lam"),  # a wrapped method's option with no wrapped method
    ("tempo", {"of": "tempo"}, "credit.of"),
    ("entropy_mask", {"of": "no_such_method"}, "credit.of"),
    ("tempo", {"of": "rredcot", "include_reference": "maybe"}, "include_reference"),
])
def test_a_bad_wrapped_method_or_stray_option_is_refused_naming_the_field(name, options, field):
    with pytest.raises(ValueError, match=field):
        credit.get(name).make_config(options)


def test_a_wrapper_needs_a_probe_exactly_when_what_it_wraps_does():
    tempo = credit.get("tempo")
    assert not tempo.probes_model(tempo.make_config({})) and not tempo.probes_model(tempo.make_config({"of": "grpo"}))
    assert tempo.probes_model(tempo.make_config({"of": "rredcot"}))
    r = text_rollouts(TEXTS, REWARDS, GROUPS)
    with pytest.raises(ValueError, match="'tempo' uses the model"):  # named before any work, not deep inside
        tempo(r, None, tempo.make_config({"of": "rredcot"}))
    assert torch.allclose(tempo(r, None, tempo.make_config({})).advantages, run_estimator("tempo", r).advantages)


def test_spec_keys_are_paths_in_the_wrappers_config_and_wrappers_nest():
    """A key the wrapper knows is its own, options.<key> the wrapped method's, an unknown key a shortcut into
    options; a key given twice is refused (the later one would silently win)."""
    tempo = credit.get("tempo")
    own = tempo.make_config(credit.parse_spec("tempo:of=rredcot:lam=0.25")[1])
    assert own.lam == 0.25 and "lam" not in own.options
    handed = tempo.make_config(credit.parse_spec("tempo:of=rredcot:options.lam=0.25")[1])
    assert handed.lam == 1.0 and handed.options == {"lam": "0.25"}
    assert credit.get("rredcot").make_config(handed.options).lam == 0.25  # not its default (0.5)
    spec = "shuffled:of=tempo:options.of=rredcot:include_reference=false"
    shuffled = credit.get("shuffled").make_config(credit.parse_spec(spec)[1])
    assert shuffled.of == "tempo" and shuffled.options == {"of": "rredcot", "include_reference": "false"}
    inner = tempo.make_config(shuffled.options)
    assert inner.of == "rredcot" and inner.options == {"include_reference": "false"}
    assert not privileged(spec) and privileged("shuffled:of=tempo:options.of=rredcot")
    with pytest.raises(ValueError, match="'of' is given twice"):
        credit.parse_spec("shuffled:of=tempo:of=rredcot")


def test_an_option_that_does_nothing_under_of_is_refused_and_wrapped_errors_name_their_path():
    with pytest.raises(ValueError, match="credit.std/eps do nothing with of=rredcot"):
        credit.get("entropy_mask").make_config({"of": "rredcot", "std": "population"})
    credit.get("entropy_mask").make_config({"std": "population"})  # without of= it is the mask's own GRPO's
    with pytest.raises(ValueError, match=r"credit\.options\.include_reference"):
        credit.get("tempo").make_config({"of": "rredcot", "include_reference": "maybe"})


def test_a_wrapper_reads_the_batch_segments_exactly_when_what_it_wraps_does():
    tempo, shuffled = credit.get("tempo"), credit.get("shuffled")
    assert not tempo.reads_batch_segments(tempo.make_config({}))  # tokens: no segments
    assert tempo.reads_batch_segments(tempo.make_config({"of": "rredcot"}))
    assert not tempo.reads_batch_segments(tempo.make_config({"of": "lambda_grpo"}))
    nested = shuffled.make_config({"of": "tempo", "options.of": "rredcot"})
    assert shuffled.reads_batch_segments(nested)
