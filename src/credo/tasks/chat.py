"""Prompts shared by the free-form (chat-model) tasks: teacher context, localisation, segmentation."""

from __future__ import annotations

from typing import Sequence

# A chat backend splits a prompt at this marker: what precedes it joins the system prompt.
SYSTEM_SPLIT = "\x00"


def reference_prompt(question: str, reference_solution: str) -> str:
    """SC-GRPO teacher context for chat models: the verified solution goes into the system prompt."""
    return ("A verified correct solution to the user's problem follows; use it as a reference.\n\n"
            + reference_solution + SYSTEM_SPLIT + question)


def localisation_prompt(question: str, steps: Sequence[str]) -> str:
    """SRPO's self-localisation request: told only that the answer is wrong, name the first wrong step."""
    numbered = "\n".join(f"Step {i + 1}: {s.strip()}" for i, s in enumerate(steps))
    return (f"Problem: {question}\n\nA solution, split into numbered steps:\n{numbered}\n\n"
            "The final answer of this solution is wrong. Which step contains the first error? "
            "Reply with the step number only.")


class FreeFormTask:
    """Defaults for tasks whose completions are free text: no step labels, chat-style probes."""

    has_step_labels = False
    default_segmenter = "keyword_entropy"
    system_prompt: str | None = None

    def step_truth(self, problem, completion):  # noqa: ANN001
        return None

    def reference_prompt(self, problem, reference_solution: str) -> str:  # noqa: ANN001
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
