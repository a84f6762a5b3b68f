"""`arith`: stepwise chain arithmetic with known step truth.

Prompt `37+48-12+55\\n`; worked solution, one step per line, then the answer line:

    37+48=85
    85-12=73
    73+55=128
    #### 128

A step line is correct when it applies the problem's next operation to the value written on the
line before (so an early slip is the *first* error, and later lines that carry it forward correctly
are not errors). Two markers exist only for teacher forcing and are never sampled: `?` starts an
early answer (the forced-answer probe of RREDCoT) and `|` separates a reference solution placed
before the prompt (SC-GRPO's teacher context).

The localisation request (`localisation_prompt`, what SRPO's `prompt` localiser sends) is rendered
for the tiny model: the problem, the trace's steps numbered `Step i: <line>`, then the question
`First wrong step?`; the reply the parser reads is `Step k` (`Step 0`: no wrong step). Its letters
are not in ALPHABET: only a start trained with localisation examples (`LOCALISATION_ALPHABET` added
to its alphabet) can read it.

Two registered presets (`PRESETS`): `arith` (3-5 two-digit terms) and `arith-long` (8-12 one-digit
terms: long chains whose first errors spread over the whole chain, the testbed where credit
assignment has room; see docs/results/arith-long-calibration/). Each preset's held-out split is
the hash split of its own problem distribution.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from credo.core.config import UserError, check
from credo.core.protocols import Problem, StepTruth
from credo.tasks.base import HELDOUT_SEED, VALIDATION_SEED, apply_op, in_heldout_split, running_sum_truth

ALPHABET = "0123456789+-*=#\n ?|"
PROBE_MARKER = "?"
REFERENCE_SEPARATOR = "|"
STEP_RE = re.compile(r"^(\d+)([+\-*])(\d+)=(-?\d+)$")
ANSWER_RE = re.compile(r"^####\s*(-?\d+)$")
LOCALISATION_QUESTION = "First wrong step?"
LOCALISATION_STEP = "Step {}"
"""A localisation reply: `Step k` names the first wrong step (1-based; 0 = none), as parse_step_index reads it."""
LOCALISATION_ALPHABET = "".join(sorted(set(LOCALISATION_QUESTION + LOCALISATION_STEP.format(": ")) - set(ALPHABET)))
"""Characters of the localisation request that ALPHABET lacks (added to a localising start's alphabet)."""
MAX_MISSES = 100_000  # draws in a row without a new problem after which a problem space counts as used up


@dataclass(frozen=True)
class ArithConfig:
    """Difficulty of the chain-arithmetic task."""

    min_terms: int = 3
    """Fewest operands of a problem (2..max_terms); steps = terms - 1, plus the answer line."""
    max_terms: int = 5
    """Most operands of a problem (min_terms..12)."""
    digits: int = 2
    """Operand size in digits, 1..4 (2 -> operands 10..99)."""
    ops: str = "+-"
    """Operators drawn uniformly, a non-empty subset of '+-*' ('*' multiplies by one digit 2..9; a '-' never
    takes the running total below zero)."""
    heldout_permille: int = 100
    """Share (per mille, 1..500) of all problems reserved for the held-out split; the split is a hash of the
    problem text, so the two splits are disjoint by construction."""

    def __post_init__(self) -> None:
        check(2 <= self.min_terms <= self.max_terms <= 12,
              f"task.min_terms/max_terms must satisfy 2 <= min <= max <= 12, got {self.min_terms}/{self.max_terms}")
        check(1 <= self.digits <= 4, f"task.digits must be in 1..4, got {self.digits}")
        check(bool(self.ops) and set(self.ops) <= set("+-*"),
              f"task.ops must be a non-empty subset of '+-*', got {self.ops!r}")
        check(1 <= self.heldout_permille <= 500,
              f"task.heldout_permille must be in 1..500, got {self.heldout_permille}")


# Task name -> its difficulty preset (user options override single fields of it).
PRESETS: dict[str, ArithConfig] = {
    "arith": ArithConfig(),
    "arith-long": ArithConfig(min_terms=8, max_terms=12, digits=1),
}


class ArithTask:
    """Chain arithmetic; see the module docstring for the format and the step-truth rule."""

    has_step_labels = True
    default_segmenter = "lines"  # one arithmetic step per line: segments line up with the step labels
    system_prompt = None  # the tiny model has no system turn
    alphabet = ALPHABET
    banned_in_sampling = PROBE_MARKER + REFERENCE_SEPARATOR

    def __init__(self, config: ArithConfig | None = None, name: str = "arith") -> None:
        self.config = config or PRESETS[name]
        self.name = name
        self._heldout_cache: list[Problem] = []
        self._heldout_exhausted = False
        self.train_exclude: frozenset[str] = frozenset()  # keys training never draws (a run on its validation split)

    # --- problems and splits --------------------------------------------------------------------
    def _random_problem(self, rng: random.Random) -> Problem:
        cfg = self.config
        lo, hi = (10 ** (cfg.digits - 1) if cfg.digits > 1 else 0), 10 ** cfg.digits - 1
        n_terms = rng.randint(cfg.min_terms, cfg.max_terms)
        terms, ops = [rng.randint(lo, hi)], []
        total = terms[0]
        for _ in range(n_terms - 1):
            op = rng.choice(cfg.ops)
            if op == "-" and total < lo:
                op = "+" if "+" in cfg.ops else "*"
            if op == "-":
                operand = rng.randint(lo, min(hi, total))
            elif op == "*":
                operand = rng.randint(2, 9)
            else:
                operand = rng.randint(lo, hi)
            total = apply_op(total, op, operand)
            ops.append(op)
            terms.append(operand)
        expression = str(terms[0]) + "".join(f"{o}{t}" for o, t in zip(ops, terms[1:]))
        return Problem(key=expression, prompt=expression + "\n", answer=str(total), data={"terms": terms, "ops": ops})

    def is_heldout(self, problem: Problem) -> bool:
        return in_heldout_split(problem.key, self.config.heldout_permille)

    def train_problems(self, n: int, generator: torch.Generator) -> list[Problem]:
        """n training problems drawn with `generator` (never from the held-out split)."""
        rng = random.Random(int(torch.randint(0, 2**62, (1,), generator=generator)))
        out, misses = [], 0
        while len(out) < n:
            p = self._random_problem(rng)
            if not self.is_heldout(p) and p.key not in self.train_exclude:
                out.append(p)
                misses = 0
            else:
                misses += 1
                if misses > MAX_MISSES:
                    raise UserError(f"task {self.name}: its options leave no training problems outside the held-out "
                                    "split (lower task.heldout_permille or widen task.digits/min_terms/max_terms/ops)")
        return out

    def heldout_problems(self, n: int) -> list[Problem]:
        """The first n problems of the fixed held-out sequence (the same on every machine); fewer when the
        task's options leave fewer distinct held-out problems than n."""
        if len(self._heldout_cache) < n and not self._heldout_exhausted:
            out, self._heldout_exhausted = self._fixed_sequence(HELDOUT_SEED, self.is_heldout, n)
            if not out:
                raise UserError(f"task {self.name}: its options leave no held-out problems (raise "
                                "task.heldout_permille or widen task.digits/min_terms/max_terms/ops)")
            self._heldout_cache = out
        return self._heldout_cache[:n]

    def validation_problems(self, n: int) -> list[Problem]:
        """The first n problems of a fixed sequence of training-split problems (VALIDATION_SEED: distinct, never
        held-out, the same on every machine): what a run that chooses between methods evaluates on
        (train.eval_split=validation, which also keeps them out of its training draws), so that the held-out set
        judges only the choice."""
        return self._fixed_sequence(VALIDATION_SEED, lambda p: not self.is_heldout(p), n)[0]

    def _fixed_sequence(self, seed: int, accept: Callable[[Problem], bool], n: int) -> tuple[list[Problem], bool]:
        """(the first n distinct problems `accept` takes from the sequence seeded `seed`, whether the sequence ran
        dry first: MAX_MISSES draws in a row gave nothing new, as a small problem space does)."""
        rng = random.Random(seed)
        seen: set[str] = set()
        out: list[Problem] = []
        misses = 0
        while len(out) < n:
            p = self._random_problem(rng)
            if accept(p) and p.key not in seen:
                seen.add(p.key)
                out.append(p)
                misses = 0
            else:
                misses += 1
                if misses > MAX_MISSES:  # a small problem space: every problem it accepts has been drawn
                    return out, True
        return out, False

    # --- solutions and verification ---------------------------------------------------------------
    def solution_lines(self, problem: Problem) -> list[str]:
        terms, ops = problem.data["terms"], problem.data["ops"]
        lines, total = [], terms[0]
        for op, operand in zip(ops, terms[1:]):
            new = apply_op(total, op, operand)
            lines.append(f"{total}{op}{operand}={new}")
            total = new
        return lines + [f"#### {total}"]

    def solution(self, problem: Problem) -> str:
        return "\n".join(self.solution_lines(problem))

    def reference_solution(self, problem: Problem) -> list[str]:
        """The worked solution as step pieces (line + newline; the answer line last) whose
        concatenation is the solution: piece j is step j, aligned with the `lines` segmenter."""
        lines = self.solution_lines(problem)
        return [line + "\n" for line in lines[:-1]] + lines[-1:]

    def extract_answer(self, completion: str) -> str | None:
        lines = [line for line in completion.split("\n") if line != ""]
        if not lines:
            return None
        return read_answer(lines[-1].strip())

    def is_correct(self, problem: Problem, completion: str) -> bool:
        return self.extract_answer(completion) == problem.answer

    def check_answer(self, problem: Problem, answer: str) -> bool:
        """Whether a bare final answer (as extract_answer returns it) is right."""
        return answer.strip() == problem.answer

    def reward(self, problem: Problem, completion: str) -> float:
        return 1.0 if self.is_correct(problem, completion) else 0.0

    def step_truth(self, problem: Problem, completion: str) -> StepTruth:
        """Which lines of `completion` are correct given the values written before them."""
        terms, ops = problem.data["terms"], problem.data["ops"]
        lines = completion.split("\n")
        if lines and lines[-1] == "":
            lines = lines[:-1]
        return running_sum_truth(lines, terms, ops, STEP_RE, read_answer)

    # --- probes and teacher context -----------------------------------------------------------------
    def answer_probe(self, answer: str) -> tuple[str, str]:
        """(template, answer text) teacher-forced after a partial solution; the policy appends EOS."""
        return PROBE_MARKER, answer

    def reference_prompt(self, problem: Problem, reference_solution: str) -> str:
        """The prompt with a verified solution placed before it (SC-GRPO's teacher context)."""
        return reference_solution + REFERENCE_SEPARATOR + problem.prompt

    def localisation_prompt(self, problem: Problem, steps: Sequence[str]) -> str:
        """SRPO's localisation request in this task's rendering (module docstring): the problem, the
        trace's steps (the `lines` segments) numbered from 1, the question."""
        chain = "".join(LOCALISATION_STEP.format(i) + ": " + step.strip() + "\n" for i, step in enumerate(steps, 1))
        return problem.prompt + chain + LOCALISATION_QUESTION + "\n"

    def early_answer_text(self, problem: Problem, n_lines: int) -> str:
        """First `n_lines` solution lines followed by the early-answer probe (SFT mixture)."""
        lines = self.solution_lines(problem)[:n_lines]
        prefix = "".join(line + "\n" for line in lines)
        template, answer = self.answer_probe(problem.answer)
        return prefix + template + answer


def read_answer(line: str) -> str | None:
    """The answer an answer line (`#### 42`) gives; None for any other line."""
    match = ANSWER_RE.match(line)
    return match.group(1) if match else None
