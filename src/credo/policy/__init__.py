"""Policy backends: the tiny GPT (fast on CPU) behind one interface."""

from credo.policy.base import Policy, SamplingConfig, Samples  # noqa: F401
from credo.policy.tiny import TinyPolicy  # noqa: F401


def load_policy(path: str, device: str = "cpu") -> "Policy":
    """Load a saved policy directory (tiny backend)."""
    return TinyPolicy.load(path, device)
