"""What `credo audit` scores against the Monte Carlo reference: AuditConfig, checked field by field (the protocol is
credo.lab.audit.run's docstring)."""

from __future__ import annotations

from dataclasses import dataclass, field

from credo.core.config import MAX_GROUP, MAX_HELD_OUT, MAX_SAMPLES, check, check_in
from credo.core.segment import SEGMENTERS
from credo.policy.device import check_device_fields
from credo.strategies import LOCALISERS


@dataclass(frozen=True)
class AuditConfig:
    """What `credo audit` scores against the Monte Carlo reference."""

    checkpoint: str = ""
    """A credo checkpoint, a Hugging Face model directory, smollm2-135m or a training run (its final/);
    '' or 'sft' = the task's SFT start (credo.train.starts.resolve_checkpoint)."""
    task: str = "arith"
    """Task: 'arith', 'arith-long', 'gym:<dataset>' or 'jsonl:<path>'."""
    task_options: dict = field(default_factory=dict)
    """The task's own options."""
    n: int = 256
    """Traces audited (n / group_size held-out prompts)."""
    group_size: int = 8
    """Traces sampled per prompt (the group the estimators see)."""
    k_ref: int = 32
    """MC continuations per segment boundary for the reference values."""
    methods: tuple[str, ...] = ("vineppo",)
    """Estimator specs, each 'name' or 'name:key=value:key=value' (e.g. 'vineppo:k=9'); the random, grpo and
    first_step floors are always added."""
    localisers: tuple[str, ...] = ()
    """Reset localisers scored against the first wrong step (random, value, oracle, self; prompt needs a model that
    can read the task's localisation request: a chat model, or sft:arith-long-skilled on arith-long)."""
    segmenter: str = ""
    """Audit segments, every estimator's too ('' = the task's own: lines on arith, one step each, so step
    labels line up; keyword_entropy on free-form tasks)."""
    temperature: float = 1.0
    """Sampling temperature of the traces and the reference."""
    max_new_tokens: int = 96
    """Generation limit per completion."""
    batch_size: int = 1024
    """Rows per forward pass of the reference sampling."""
    device: str = "auto"
    """Where the model runs: auto (CUDA when torch finds a GPU, else the CPU), cpu, cuda or cuda:N (docs/gpu.md)."""
    dtype: str = "float32"
    """float32; bfloat16 (a Hugging Face model's weights, on a GPU); or bfloat16-mixed (float32 weights, matrix
    products in bfloat16 under torch.autocast: a Hugging Face model, on a CPU with AMX/AVX512-BF16 or a GPU)."""
    seed: int = 0
    """Seed of the sampled traces and the reference."""
    localiser_max_new_tokens: int = field(default=4096, metadata={"omit_default": True})
    """Reply limit of the `prompt` localiser's request (SRPO's public code and reset.prompt_max_new_tokens: 4096;
    a small chat model on a CPU may ramble to it, so an audit there may cap it and says so in audit.json)."""

    def __post_init__(self) -> None:
        check_device_fields(self.device, self.dtype, "audit.")
        check_in(self.localiser_max_new_tokens, 1, 4096, "audit.localiser_max_new_tokens")
        check_in(self.group_size, 2, MAX_GROUP, "audit.group_size")
        check(self.n >= self.group_size >= 2,
              f"audit.n must be >= audit.group_size >= 2, got {self.n}/{self.group_size}")
        check(self.k_ref >= 2, f"audit.k_ref must be >= 2, got {self.k_ref}")
        check_in(self.n, 2, MAX_HELD_OUT, "audit.n")
        check_in(self.k_ref, 2, MAX_SAMPLES, "audit.k_ref")
        check(self.temperature > 0, f"audit.temperature must be > 0, got {self.temperature}")
        check(1 <= self.max_new_tokens <= 4096, f"audit.max_new_tokens must be in 1..4096, got {self.max_new_tokens}")
        check(self.batch_size >= 1, f"audit.batch_size must be >= 1, got {self.batch_size}")
        check(self.segmenter == "" or self.segmenter in SEGMENTERS,
              f"audit.segmenter must be '' (the task's own) or one of {sorted(SEGMENTERS)}, got {self.segmenter!r}")
        for name in self.localisers:
            check(name in LOCALISERS.names(),
                  f"audit.localisers: unknown localiser {name!r}; available: {tuple(LOCALISERS.names())}")
