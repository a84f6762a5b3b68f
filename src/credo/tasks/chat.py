"""Prompts shared by the free-form (chat-model) tasks: teacher context, localisation, segmentation."""

from __future__ import annotations

from typing import Sequence

from credo.core.rollouts import Prompt


def reference_prompt(question: str, reference_solution: str) -> Prompt:
    """SC-GRPO teacher context for chat models: the verified solution goes into the system turn."""
    return Prompt(user=question, system="A verified correct solution to the user's problem follows; use it as a "
                                        "reference.\n\n" + reference_solution)


def localisation_prompt(question: str, steps: Sequence[str]) -> str:
    """SRPO's self-localisation request as its public code words it (the "L2, early-biasing" prompt of
    Ankur-Samanta/SRPO, MIT licence): told only that the answer is wrong, find the step where the
    error originated (not where it shows), and end with \\boxed{N}, the step number."""
    n = len(steps)
    chain = "".join(f"\nStep {i}: {s.strip()}" for i, s in enumerate(steps, 1))
    return ("You are tasked with localizing the first erroneous thought in your previous solution to this "
            f"problem.\n\nProblem: {question}\n\nYour incorrect reasoning chain:\n{chain}\n\n"
            "The final answer this chain produces is incorrect \u2014 therefore at least one step contains an "
            "error. The error you are looking for is the originating step where a key decision or action "
            "derailed the reasoning, not just the step where the failure ultimately becomes visible. A misread "
            "of the problem, an unjustified assumption, or a logical flaw can look fine for several follow-on "
            "steps before it surfaces in the wrong answer. A step is erroneous if you cannot justify its "
            "claims from the problem statement and earlier verified steps alone. Find the originating step, "
            "not just the symptom.\n\nDo NOT re-solve the problem. Your ONLY task is to identify the step "
            "number of that originating error.\n\nRequirements:\n"
            f"- Commit to exactly ONE step number (1 to {n}).\n"
            "- Stop at the first step you cannot justify.\n"
            "- MANDATORY final line: your response MUST end with \\boxed{N} on its own line, where N is the "
            "step index (1-indexed) of the first erroneous step in the chain above \u2014 NOT the answer to "
            "the problem. Do NOT add any text after the \\boxed{N}.\n")


class FreeFormTask:
    """Defaults for tasks whose completions are free text: no step labels, chat-style probes."""

    has_step_labels = False
    default_segmenter = "keyword_entropy"
    system_prompt: str | None = None

    def step_truth(self, problem, completion):  # noqa: ANN001
        return None

    def reference_prompt(self, problem, reference_solution: str) -> Prompt:  # noqa: ANN001
        return reference_prompt(problem.prompt, reference_solution)

    def localisation_prompt(self, problem, steps: Sequence[str]) -> str:  # noqa: ANN001
        return localisation_prompt(problem.prompt, steps)

    def worked_solution(self, problem) -> str | None:  # noqa: ANN001
        """The problem's worked solution text, if its source carries one (jsonl: a `solution` field)."""
        solution = problem.data.get("solution")
        return solution if isinstance(solution, str) and solution.strip() else None

    def reference_solution(self, problem) -> list[str] | None:  # noqa: ANN001
        """The worked solution as step pieces whose concatenation is the reference completion (one
        piece per non-blank line, blank lines kept with the line before), ending with the task's
        answer template + gold answer when the solution does not state a final answer itself; None
        without a worked solution. Used as RREDCoT's reference tail (docs/methods.md, "## RREDCoT")."""
        solution = self.worked_solution(problem)
        if solution is None:
            return None
        steps: list[str] = []
        for line in solution.splitlines(keepends=True):
            if steps and not line.strip():
                steps[-1] += line
            else:
                steps.append(line)
        if self.extract_answer(solution) is None:
            template, answer = self.answer_probe(problem.answer)
            steps.append(template + answer)
        return steps

    def reward(self, problem, completion: str) -> float:  # noqa: ANN001
        answer = self.extract_answer(completion)
        return 1.0 if answer is not None and self.check_answer(problem, answer) else 0.0

    def is_correct(self, problem, completion: str) -> bool:  # noqa: ANN001
        return self.reward(problem, completion) >= 1.0
