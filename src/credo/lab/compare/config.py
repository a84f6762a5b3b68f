"""`credo compare`'s settings: CompareConfig, the preset it runs and what replaces the preset's methods, seeds,
budget, schedule and task (credo.lab.compare.presets holds the presets)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from credo.core.config import MAX_EPOCHS, MAX_HELD_OUT, MAX_STEP_COMPLETIONS, check
from credo.integrations import tracking
from credo.lab.compare.grid import UNTIL
from credo.lab.compare.presets import MAX_GRAD_CLIP, MAX_JOBS, PRESETS, SCHEDULE, check_method_specs
from credo.policy.adapters import LoraSettings
from credo.policy.device import check_device_fields

@dataclass(frozen=True)
class CompareConfig:
    """What `credo compare` runs: a preset, and the caller's replacements of its settings."""

    preset: str = "quick"
    """quick (`make demo`, ~6 min on 2 cores: 1 seed, 4 methods), full (3 seeds, every method and the shuffled
    controls), long (arith-long, 12 methods incl. controls, 5 seeds), long-skilled (round two on the skilled
    arith-long start, 13 methods, 5 seeds; --start sft:arith-long-skilled), dapo-credit (long-skilled's protocol,
    credit methods on DAPO's recipe: dapo:of=<estimator>), smollm2 (SmolLM2-135M on gym:chain_sum, 2 seeds; needs
    --start), smollm2-long (round two on 5-8 term chains, 3 seeds; needs --start) or smoke (tests)."""
    methods: tuple[str, ...] | None = None
    """Methods instead of the preset's, each a name or name:key=value (e.g. shuffled:of=rredcot); grpo is
    always added."""
    seeds: tuple[int, ...] | None = None
    """Seeds instead of the preset's."""
    start: str = ""
    """Start checkpoint of every run ('' = the SFT start of the task)."""
    task: str = ""
    """Task of every run instead of the preset's ('' = the preset's: arith; long: arith-long)."""
    jobs: int | None = None
    """Trainings at once, each in its own process with cpu_count/jobs threads (None = the preset's)."""
    budget: int | None = None
    """Generated tokens per training run instead of the preset's (evaluated every quarter of it)."""
    epochs: int | None = None
    """Optimiser passes per batch shared by every method (None = the training default); a recipe that sets
    its own keeps it and the report lists it."""
    minibatches: int | None = None
    """AdamW steps per pass shared by every method (None = the training default)."""
    lr: float | None = None
    """Learning rate shared by every method (None = the training default); a sweep is one comparison per
    value, each into its own --out."""
    grad_clip: float | None = None
    """Gradient-norm clip shared by every method (None = the training default, 1.0). Clipping acts unequally
    on methods (the report shows each one's share of clipped steps); a very large value turns it off for all."""
    report_to: tuple[str, ...] = ()
    """Experiment trackers each run also logs to, as its own tracker run grouped by the comparison (--out's
    name): any of tensorboard, wandb, mlflow, trackio; stores under --out (docs/tracking.md). None by default."""
    device: str = "auto"
    """Where every run and the audit run: auto (CUDA when torch finds a GPU, else the CPU), cpu, cuda or cuda:N
    (docs/gpu.md); each run records the device it resolved to, and a comparison continues only on it."""
    dtype: str = "float32"
    """float32; bfloat16 (a Hugging Face start's weights, on a GPU); or bfloat16-mixed (float32 weights, matrix
    products in bfloat16 under torch.autocast: a Hugging Face start, on a CPU with AMX/AVX512-BF16 or a GPU)."""
    share_gpu: bool = False
    """On a GPU, run `jobs` trainings at once, each process with its own copy of the model on the one device
    (default false: one after another, as one training keeps a GPU busy)."""
    eval_split: str = "heldout"
    """Where every run's curve and final accuracy are measured: 'heldout' (the test set) or 'validation', a fixed
    set of training-split problems the runs never train on (train.eval_split; arith and gym: tasks): for choosing a
    method or a setting, after which the choice alone is judged on the held-out set."""
    audit_n: int | None = None
    """Traces of the credit audit of the start, run after the trainings, instead of the preset's (0 skips it;
    else >= 4): its MC reference can take longer than a one-method measurement's training."""
    premise_n: int | None = None
    """Traces of the premise checks on the start and every final policy instead of the preset's (0 skips them)."""
    until: str = ""
    """HH:MM (local time; tomorrow's when today's has passed) by which this invocation should have finished what it
    can, for a machine lent for a fixed time (a session, a batch job's limit): a run its estimate says cannot end
    by then gives way to the next in order that can; when none can, the next starts anyway (its checkpoints keep
    its progress for a resume). '' = plan order (every method's first seed first)."""
    export_each: str = ""
    """A folder into which --out is exported (as `--export` does: each finished run's record, no weights, then the
    report) as each run ends and once more at the end, so a machine lost mid-comparison loses only the runs in
    flight; a refused or failed export is said and the comparison goes on. '' = none."""
    lora: LoraSettings = field(default_factory=LoraSettings, metadata={"omit_default": True})
    """LoRA adapters for every run alike (lora.r > 0; a Hugging Face start): each run trains fresh adapters of
    these settings on its start (an adapter start merged into its base first) and its checkpoints hold them alone;
    the KL reference is the start with the adapters off. Off by default (lora.r=0): every weight trains."""

    def __post_init__(self) -> None:
        check_device_fields(self.device, self.dtype, "compare.")
        check(self.eval_split in ("heldout", "validation"),
              f"compare.eval_split must be 'heldout' or 'validation', got {self.eval_split!r}")
        check(self.preset in PRESETS, f"compare --preset must be one of {', '.join(PRESETS)}, got {self.preset!r}")
        check(self.budget is None or self.budget > 0,
              f"compare --budget must be a positive number of generated tokens, got {self.budget}")
        check(self.jobs is None or self.jobs >= 1, f"compare --jobs must be >= 1, got {self.jobs}")
        check(all(n is None or n >= 1 for n in (self.epochs, self.minibatches)),
              f"compare.epochs and compare.minibatches (--schedule) must be >= 1, got {self.epochs}x{self.minibatches}")
        check(self.epochs is None or self.epochs <= MAX_EPOCHS,
              f"compare.epochs (--schedule EPOCHSxMINIBATCHES) must be in 1..{MAX_EPOCHS}, got {self.epochs}")
        check(self.minibatches is None or self.minibatches <= MAX_STEP_COMPLETIONS,
              f"compare.minibatches (--schedule EPOCHSxMINIBATCHES) must be in 1..{MAX_STEP_COMPLETIONS:,}, got "
              f"{self.minibatches}")
        check(self.jobs is None or self.jobs <= MAX_JOBS, f"compare --jobs must be in 1..{MAX_JOBS}, got {self.jobs}")
        check(self.lr is None or self.lr > 0, f"compare --lr must be > 0, got {self.lr}")
        check(self.grad_clip is None or 0 < self.grad_clip <= MAX_GRAD_CLIP,
              f"compare.grad_clip must be in (0, {MAX_GRAD_CLIP:g}], got {self.grad_clip}")
        check(self.seeds is None or len(self.seeds) > 0, "compare.seeds: give at least one seed")
        check(self.audit_n is None or self.audit_n == 0 or 4 <= self.audit_n <= MAX_HELD_OUT,
              f"compare.audit_n must be 0 (no audit) or in 4..{MAX_HELD_OUT:,}, got {self.audit_n}")
        check(self.premise_n is None or 0 <= self.premise_n <= MAX_HELD_OUT,
              f"compare.premise_n must be in 0..{MAX_HELD_OUT:,} (0: no premise checks), got {self.premise_n}")
        check(not self.until or (isinstance(self.until, str) and UNTIL.fullmatch(self.until) is not None),
              f"compare --until must be a time of day HH:MM (e.g. 13:05; in YAML or --set, quoted), got "
              f"{self.until!r}")
        check_method_specs(self.methods or (), where="compare --methods")
        object.__setattr__(self, "report_to", tracking.checked_names(self.report_to, "compare.report_to"))

    @property
    def schedule(self) -> dict[str, Any]:
        """The shared-schedule fields given (epochs, minibatches, lr, grad_clip), as `compare(schedule=...)` takes
        them."""
        return {k: getattr(self, k) for k in SCHEDULE if getattr(self, k) is not None}
