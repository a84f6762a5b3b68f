"""`jsonl:<path>`: math problems from a JSONL file of {"question", "answer"}, verified by math-verify.

An optional text field "solution" (a worked solution) becomes the task's reference solution.

The completion's answer is the content of its last \\boxed{...}. A malformed row is an error that
names its line, unless `skip_bad_rows` is set (then it is reported once and skipped). The held-out
split is a hash of the question (`heldout_permille` per mille), disjoint from training; repeated
questions are kept once. A held-out split smaller than asked for is reported with its true size.
math-verify's signal-based time-outs only work on the main thread, so they are turned off elsewhere.
"""

from __future__ import annotations

import codecs
import json
import sys
import threading
from dataclasses import dataclass
from typing import Any

import torch

from credo.core.config import UserError, check
from credo.core.protocols import Problem
from credo.tasks.base import in_heldout_split
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


def _parse_row(raw: bytes, max_question_chars: int) -> Problem:
    """One line -> Problem; ValueError says what is wrong with it."""
    if len(raw) > 4 * max_question_chars + 4096:  # before parsing: a huge row is refused without decoding it
        raise ValueError(f"row is {len(raw)} bytes, over the limit max_question_chars={max_question_chars}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"not UTF-8 (byte {err.start})") from None
    row = json.loads(text)
    if not isinstance(row, dict):
        raise ValueError("a row must be a JSON object")
    missing = [k for k in ("question", "answer") if not isinstance(row.get(k), (str, int, float))
               or isinstance(row.get(k), bool)]
    if missing:
        raise ValueError(f"missing or non-text field(s): {', '.join(missing)}")
    question = str(row["question"])
    if len(question) > max_question_chars:
        raise ValueError(f"question is {len(question)} characters, over the limit "
                         f"max_question_chars={max_question_chars}")
    if not question.strip():
        raise ValueError("empty question")
    data = {"solution": row["solution"]} if isinstance(row.get("solution"), str) else {}  # RREDCoT's reference tail
    for name, value in (("question", question), ("answer", str(row["answer"])), *data.items()):
        try:  # JSON's \ud800 escapes can spell a lone surrogate, which no UTF-8 text (a prompt, a log) can hold
            value.encode("utf-8")
        except UnicodeEncodeError as err:
            raise ValueError(f"{name} holds a lone UTF-16 surrogate (\\u{ord(value[err.start]):04x} at character "
                             f"{err.start}), which is not text") from None
    return Problem(key=question, prompt=question, answer=str(row["answer"]), data=data)


_REPORTED: set[tuple[str, int]] = set()
"""(file, rows skipped) already reported by this process."""


def read_rows(path: str, skip_bad_rows: bool, max_question_chars: int = 16_000) -> list[Problem]:
    """The file's problems; a bad row is a UserError naming its line, or (skip_bad_rows) skipped and counted."""
    problems, bad = [], []
    try:
        handle = open(path, "rb")
    except (FileNotFoundError, IsADirectoryError):
        raise UserError(f"task file {path} does not exist or is not a file") from None
    with handle:
        for number, raw in enumerate(handle, 1):
            if number == 1 and raw.startswith(codecs.BOM_UTF8):  # utf-8-sig: as Windows editors save UTF-8
                raw = raw[len(codecs.BOM_UTF8):]
            if not raw.strip():
                continue
            try:
                problem = _parse_row(raw.rstrip(b"\r\n"), max_question_chars)
            except ValueError as err:
                message = f"{path}:{number}: {err}"
                if not skip_bad_rows:
                    raise UserError(message + " (set task_options.skip_bad_rows=true to skip such rows)") from None
                bad.append(message)
                continue
            problems.append(Problem(problem.key, problem.prompt, problem.answer, data={"line": number, **problem.data}))
    if bad and (path, len(bad)) not in _REPORTED:  # a command may build the task more than once: say it once
        _REPORTED.add((path, len(bad)))
        print(f"jsonl task: skipped {len(bad)} malformed row(s); first: {bad[0]}", file=sys.stderr)
    if not problems:
        raise UserError(f"{path}: no usable rows")
    return problems


def _unique(problems: list[Problem]) -> list[Problem]:
    seen: set[str] = set()
    return [p for p in problems if not (p.key in seen or seen.add(p.key))]


@dataclass(frozen=True)
class JsonlOptions:
    """skip_bad_rows: skip (and count) malformed rows instead of stopping at the first. heldout_permille:
    share of questions (by hash) held out. max_question_chars: longer questions are refused (a huge
    prompt would ask for a huge KV cache). truncate_prompts: a question too long for the model's context
    loses its start to fit (marked '…'); off, such a question is an error naming its row."""

    skip_bad_rows: bool = False
    heldout_permille: int = 100
    max_question_chars: int = 16_000
    truncate_prompts: bool = False

    def __post_init__(self) -> None:
        check(0 <= self.heldout_permille <= 1000, f"heldout_permille must be in 0..1000, got {self.heldout_permille}")
        check(self.max_question_chars >= 1, f"max_question_chars must be >= 1, got {self.max_question_chars}")


class JsonlTask(FreeFormTask):
    """Rows with the same question are one problem: they land in the same split, and once in it."""

    def __init__(self, path: str, options: JsonlOptions = JsonlOptions()) -> None:
        skip_bad_rows, heldout_permille, max_question_chars = (options.skip_bad_rows, options.heldout_permille,
                                                               options.max_question_chars)
        self.name, self.path = f"jsonl:{path}", path
        self.truncate_prompts = options.truncate_prompts  # read by credo.policy.locate.check_context
        self.system_prompt = SYSTEM_PROMPT
        rows = _unique(read_rows(path, skip_bad_rows, max_question_chars))
        held = [p for p in rows if in_heldout_split(p.key, heldout_permille)]
        self.heldout = held or rows[:1]
        keys = {p.key for p in self.heldout}
        self.train = [p for p in rows if p.key not in keys]
        if not self.train:
            raise UserError(f"{path}: no training questions left after holding out {len(self.heldout)} of "
                            f"{len(rows)} distinct question(s); lower task_options.heldout_permille or add rows")

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
