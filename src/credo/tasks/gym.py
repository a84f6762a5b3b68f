"""`gym:<name>`: any reasoning-gym dataset, scored by its own verifier, answers in <answer> tags.

Train, validation and held-out problems come from different generator seeds; a training or validation problem
whose question also occurs among the first `heldout_size` held-out problems is dropped, so the splits are disjoint,
and a run on the validation split (train.eval_split=validation) never trains on its validation problems.
Dataset options (e.g. min_terms, max_digits for chain_sum) pass straight to reasoning-gym, except credo's own
`step_labels`: true labels each line of a running-sum solution of a +/- chain (chain_sum, and basic_arithmetic's
+/- problems) right or wrong, as `arith` does, and cuts completions into lines, so the audit can score credit
against the first wrong step on a pretrained model.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from credo.core.config import ConfigError, UserError
from credo.core.protocols import Problem, StepTruth
from credo.tasks.base import HELDOUT_SEED, INTEGER, running_sum_truth
from credo.tasks.chat import FreeFormTask

# reasoning-gym seeds its item i with `seed + i`, so sequences whose seeds lie closer than their lengths share items
# (which the held-out filter would then drop): the validation sequence starts a long way past the held-out one,
# and is drawn in chunks of a fixed size (a few datasets shuffle items across a whole dataset, so the same n must
# not depend on how many were asked for)
GYM_VALIDATION_SEED = HELDOUT_SEED + 100_000_000
VALIDATION_CHUNK, VALIDATION_CHUNKS = 1000, 64

STEP_LINE = re.compile(r"^\s*(-?\d+)\s*([+-])\s*(-?\d+)\s*=\s*(-?\d+)\s*$")


def running_sum_solution(expression: object) -> str | None:
    """Left-to-right worked solution of a chain of integers joined by + and - (reasoning-gym's chain_sum and
    the +/- cases of basic_arithmetic carry no solution text, only `metadata.expression`): one line per
    operation, "4 - 1 = 3" then "3 - 7 = -4". None for any other expression (products, brackets, decimals)."""
    if not isinstance(expression, str):
        return None
    tokens = expression.split()
    if len(tokens) < 3 or len(tokens) % 2 == 0 or not all(INTEGER.match(t) for t in tokens[::2]) \
            or not all(op in "+-" and len(op) == 1 for op in tokens[1::2]):
        return None
    total, lines = int(tokens[0]), []
    for op, term in zip(tokens[1::2], tokens[2::2]):
        new = total + int(term) if op == "+" else total - int(term)
        lines.append(f"{total} {op} {term} = {new}")
        total = new
    return "\n".join(lines)


def chain(expression: str) -> tuple[list[int], list[str]]:
    """(terms, operators) of a +/- chain such as "4 - 1 + -7" (one `running_sum_solution` accepts)."""
    tokens = expression.split()
    return [int(t) for t in tokens[::2]], tokens[1::2]


def running_sum_step_truth(expression: str, completion: str, extract_answer: Any) -> StepTruth | None:
    """Which lines of `completion` are right, for the running-sum solution of the +/- chain `expression`:
    line k (k < the number of operations) must be "previous op term_k+1 = result" with the value the line
    before wrote (so an error is counted once, where it is made), and the line after them must hold the last
    value as its answer (`extract_answer` reads it); a missing line is the error. None when `expression` is
    not a +/- chain. The layout follows `running_sum_solution`, which the SFT start learns."""
    if running_sum_solution(expression) is None:
        return None
    terms, ops = chain(expression)
    lines = completion.split("\n")
    if lines and lines[-1].strip() == "":
        lines = lines[:-1]
    return running_sum_truth(lines, terms, ops, STEP_LINE, extract_answer)


class GymTask(FreeFormTask):
    def __init__(self, name: str, options: dict[str, Any] | None = None, heldout_size: int = 1000) -> None:
        try:
            import reasoning_gym
            from reasoning_gym.utils import SYSTEM_PROMPTS, extract_answer
        except ImportError as err:
            raise ImportError("gym: tasks need reasoning-gym: pip install reasoning-gym==0.1.25") from err
        self.name = f"gym:{name}"
        self.dataset_name = name
        self.options = dict(options or {})
        step_labels = self.options.pop("step_labels", False)
        if not isinstance(step_labels, bool):
            raise ConfigError(f"task_options.step_labels must be true or false, got {step_labels!r}")
        self._create = reasoning_gym.create_dataset
        self._extract = extract_answer
        self.system_prompt = SYSTEM_PROMPTS["default"]
        try:
            self.scorer = self._create(name, size=1, seed=0, **self.options)
        except Exception as err:  # unknown dataset or option: name what the user passed
            raise ConfigError(f"task gym:{name} with options {self.options}: {err}") from None
        self.heldout_size = heldout_size
        self._heldout: list[Problem] = []
        self._validation: list[Problem] = []
        self._validation_chunks = 0  # chunks of the validation sequence read so far
        self.train_exclude: frozenset[str] = frozenset()  # keys training never draws (a run on its validation split)
        if step_labels:
            sample = self._problems(HELDOUT_SEED, 1)[0]
            if running_sum_solution(self.expression(sample)) is None:
                raise ConfigError(f"task_options.step_labels: gym:{name} problems are not +/- chains (e.g. "
                                  f"{sample.prompt[:60]!r}), so their steps cannot be labelled")
            self.has_step_labels, self.default_segmenter = True, "lines"  # one step a line, as on arith

    def expression(self, problem: Problem) -> object:
        """The reasoning-gym entry's `metadata.expression` (None where it has none)."""
        return (self.entry(problem).get("metadata") or {}).get("expression")

    def step_truth(self, problem: Problem, completion: str) -> StepTruth | None:
        """Per-line truth of a running-sum completion (`step_labels`); None without step labels or for a
        problem that is not a +/- chain."""
        if not self.has_step_labels:
            return None
        return running_sum_step_truth(str(self.expression(problem)), completion, self.extract_answer)

    def _problems(self, seed: int, n: int) -> list[Problem]:
        dataset = self._create(self.dataset_name, size=n, seed=seed, **self.options)
        return [Problem(key=e["question"], prompt=e["question"], answer=str(e["answer"]), data={"entry": e})
                for e in (dataset[i] for i in range(n))]

    def heldout_problems(self, n: int) -> list[Problem]:
        if len(self._heldout) < max(n, self.heldout_size):
            self._heldout = self._problems(HELDOUT_SEED, max(n, self.heldout_size))
        return self._heldout[:n]

    def validation_problems(self, n: int) -> list[Problem]:
        """The first n distinct problems of a fixed sequence (GYM_VALIDATION_SEED, read in chunks of a fixed size:
        the same on every machine, whatever n) that are not held out: what a run that chooses between methods or
        settings evaluates on; fewer when the options leave fewer."""
        held = {p.key for p in self.heldout_problems(self.heldout_size)}
        seen = {p.key for p in self._validation}
        while len(self._validation) < n and self._validation_chunks < VALIDATION_CHUNKS:
            chunk = self._problems(GYM_VALIDATION_SEED + self._validation_chunks * VALIDATION_CHUNK, VALIDATION_CHUNK)
            self._validation_chunks += 1
            for p in chunk:
                if p.key not in held and p.key not in seen:
                    seen.add(p.key)
                    self._validation.append(p)
        if not self._validation:
            raise UserError(f"task gym:{self.dataset_name}: its options leave no problems outside the held-out split "
                            "to validate on (widen them)")
        return self._validation[:n]  # fewer than n when the options leave fewer

    def train_problems(self, n: int, generator: torch.Generator) -> list[Problem]:
        held = {p.key for p in self.heldout_problems(self.heldout_size)} | self.train_exclude
        out: list[Problem] = []
        draws = 0
        while len(out) < n:
            seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
            out.extend(p for p in self._problems(seed, n) if p.key not in held)
            draws += 1
            if draws >= 100 and not out:  # every problem the options allow is held out: it would loop for ever
                raise UserError(f"task gym:{self.dataset_name}: 100 draws of {n} problems found none outside the "
                                "held-out and validation splits (its options leave too few distinct problems)")
        return out[:n]

    def extract_answer(self, completion: str) -> str | None:
        answer = self._extract(completion, tag_name="answer")
        return answer.strip() if isinstance(answer, str) else None

    @staticmethod
    def entry(problem: Problem) -> dict:
        """The reasoning-gym entry (rebuilt from question/answer when the problem came from elsewhere, e.g. TRL)."""
        return problem.data.get("entry") or {"question": problem.prompt, "answer": problem.answer,
                                             "metadata": problem.data.get("metadata", {})}

    def worked_solution(self, problem: Problem) -> str | None:
        """A worked solution carried by the reasoning-gym entry (top-level or metadata `solution` /
        `cot` text spanning more than one line; a one-line `solution` is only an answer), else None."""
        entry = self.entry(problem)
        metadata = entry.get("metadata") or {}
        for text in (entry.get("solution"), metadata.get("solution"), metadata.get("cot")):
            if isinstance(text, str) and "\n" in text.strip():
                return text
        return running_sum_solution(metadata.get("expression"))

    def check_answer(self, problem: Problem, answer: str) -> bool:
        return float(self.scorer.score_answer(answer, self.entry(problem))) >= 1.0

    def reward(self, problem: Problem, completion: str) -> float:
        answer = self.extract_answer(completion)
        return float(self.scorer.score_answer(answer, self.entry(problem))) if answer is not None else 0.0

    def answer_probe(self, answer: str) -> tuple[str, str]:
        return "\n<answer>", f"{answer}</answer>"
