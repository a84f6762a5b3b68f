"""`jsonl:<path>`: math problems from a JSONL file of {"question", "answer"}, verified by math-verify.

The completion's answer is the content of its last \\boxed{...}. A malformed row is an error that
names its line, unless `skip_bad_rows` is set (then it is reported once and skipped). The held-out
split is a hash of the question (`heldout_permille` per mille), disjoint from training.
math-verify's signal-based time-outs only work on the main thread, so they are turned off elsewhere.
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
from typing import Any

import torch

from credo.tasks.base import Problem
from credo.tasks.chat import FreeFormTask

SYSTEM_PROMPT = "Reason step by step, and put your final answer within \\boxed{}."


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (balanced braces), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed{")
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            if depth == 0:
                return text[i:j].strip()
            depth -= 1
    return None


def read_rows(path: str, skip_bad_rows: bool) -> list[Problem]:
    problems, bad = [], []
    try:
        handle = open(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"task file {path} does not exist") from None
    with handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                if not isinstance(row, dict):
                    raise ValueError("a row must be a JSON object")
                missing = [k for k in ("question", "answer") if not isinstance(row.get(k), (str, int, float))]
                if missing:
                    raise ValueError(f"missing or non-text field(s): {', '.join(missing)}")
            except ValueError as err:
                message = f"{path}:{number}: {err}"
                if not skip_bad_rows:
                    raise ValueError(message + " (set task_options.skip_bad_rows=true to skip such rows)") from None
                bad.append(message)
                continue
            q = str(row["question"])
            problems.append(Problem(key=q, prompt=q, answer=str(row["answer"]), data={"line": number}))
    if bad:
        print(f"jsonl task: skipped {len(bad)} malformed row(s); first: {bad[0]}", file=sys.stderr)
    if not problems:
        raise ValueError(f"{path}: no usable rows")
    return problems


class JsonlTask(FreeFormTask):
    def __init__(self, path: str, skip_bad_rows: bool = False, heldout_permille: int = 100) -> None:
        self.name = f"jsonl:{path}"
        self.system_prompt = SYSTEM_PROMPT
        rows = read_rows(path, skip_bad_rows)
        held = [p for p in rows if int(hashlib.sha256(p.key.encode()).hexdigest()[:8], 16) % 1000 < heldout_permille]
        self.heldout = held or rows[:1]
        keys = {p.key for p in self.heldout}
        self.train = [p for p in rows if p.key not in keys] or rows

    def heldout_problems(self, n: int) -> list[Problem]:
        return self.heldout[:n]

    def train_problems(self, n: int, generator: torch.Generator) -> list[Problem]:
        idx = torch.randint(0, len(self.train), (n,), generator=generator).tolist()
        return [self.train[i] for i in idx]

    def extract_answer(self, completion: str) -> str | None:
        return last_boxed(completion)

    def check_answer(self, problem: Problem, answer: str) -> bool:
        from math_verify import parse, verify
        main = threading.current_thread() is threading.main_thread()
        kwargs: dict[str, Any] = {} if main else {"parsing_timeout": None}
        gold = parse("\\boxed{" + problem.answer + "}", **kwargs)
        guess = parse("\\boxed{" + answer + "}", **kwargs)
        return bool(verify(gold, guess, **({} if main else {"timeout_seconds": None})))

    def answer_probe(self, answer: str) -> tuple[str, str]:
        return "\nThe final answer is \\boxed{", answer + "}"
