"""The TRL versions credo's TRL adapter is tested on, and what it says about any other: the adapter overrides
private GRPOTrainer methods, so a version outside the tested range imports with a warning, not a refusal.
Kept apart from credo.integrations.trl so that the range can be read without importing TRL."""

from __future__ import annotations

from packaging.version import Version

TESTED_TRL = ("1.12.0", "1.13.0", "1.14.2", "1.16.0")
"""The TRL versions the adapter's tests pass on (`.ci/trl_matrix.sh` runs tests/test_trl.py on each, its
GRPO advantages equal to TRL's own included); the pinned one (pyproject) is the newest."""

SUPPORTED_TRL = TESTED_TRL[-1]
"""The TRL credo pins and its fast tests run on."""

FAILING_TRL = {
    "1.15": "trl 1.15's GRPO loss always takes its fused LM-head path, which imports triton: with a torch that has "
            "no triton (the CPU wheels) TRL's own training step fails (AttributeError in _ChunkedLogProbFunction); "
            "the adapter's advantages still equal TRL's there. Use trl 1.14.2 or 1.16.0, or a torch with triton",
}
"""TRL minor versions inside the tested range that fail the adapter's tests (.ci/trl_matrix.sh), and why."""


class UntestedTRLWarning(UserWarning):
    """The installed TRL is outside the versions the adapter was tested on (or one known to fail its tests)."""


def untested_trl_message(version: str) -> str | None:
    """Why `version` of TRL is not one the adapter passes its tests on (None when it is between the oldest and the
    newest tested version, and not of a minor in FAILING_TRL): the adapter overrides private GRPOTrainer methods,
    which any TRL release may change."""
    parsed = Version(version)
    failing = FAILING_TRL.get(f"{parsed.major}.{parsed.minor}")
    if failing:
        return f"credo.integrations.trl: found trl {version}; {failing}"
    if Version(TESTED_TRL[0]) <= parsed <= Version(TESTED_TRL[-1]):
        return None
    return (f"credo.integrations.trl was tested with trl {TESTED_TRL[0]} to {TESTED_TRL[-1]}; found trl {version}. "
            "It overrides private GRPOTrainer methods (_generate_and_score_completions, _calculate_rewards, "
            f"_tokenize_prompts): check its advantages on this version (.ci/trl_matrix.sh {version}), or "
            f"pip install trl=={SUPPORTED_TRL}")
