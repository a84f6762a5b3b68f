"""Numbers read back from credo's own records: a run's metrics.jsonl and summary.json, a comparison's results.json.

Each number a later command reads (a report, a resume, --status, an estimate) is checked as it is read: a JSON
number (not a string, not a bool), finite, an integer where credo writes one, and in its range. A record damaged
or edited since (a string where a number was, a NaN accuracy) is then one line naming the file and the field,
never a traceback, and never a NaN that sorts as the best method. Fields a record lacks are left to its reader
(an older credo wrote fewer); a record that is not a JSON object is refused whole.
"""

from __future__ import annotations

import json
import math
from typing import Any

from credo.core.config import UserError

INF = math.inf
Bound = tuple[float, float, bool]
"""(lowest, highest, integer) a field may hold."""
COUNT: Bound = (0, INF, True)
SECONDS: Bound = (0, INF, False)
FRACTION: Bound = (0, 1, False)

METRICS_FIELDS: dict[str, Bound] = {"step": COUNT, "tokens_generated": COUNT, "tokens_scored": COUNT,
                                    "seconds": SECONDS, "eval_accuracy": FRACTION, "grad_norm": (0, INF, False),
                                    "update_norm": (0, INF, False)}
"""The fields of a metrics.jsonl row that credo reads back."""
SUMMARY_FIELDS: dict[str, Bound] = {"step": COUNT, "tokens_generated": COUNT, "seconds": SECONDS,
                                    "final_accuracy": FRACTION, "final_eval_n": COUNT, "overlong_buffer_used": COUNT,
                                    "longest_worked_solution": COUNT}
"""The fields of a run's summary.json that credo reads back."""
RESULT_FIELDS: dict[str, Bound] = {"final_accuracy": FRACTION, "steps": COUNT, "tokens_generated": COUNT,
                                   "seconds": (-INF, INF, False), "stalled_seconds": SECONDS, "stalled_steps": COUNT,
                                   "seconds_per_step": (-INF, INF, False), "tokens_scored": COUNT}
"""The fields of one run's entry in a comparison's results.json (compare.runs.run_result) that its report reads."""
CURVE_FIELDS: dict[str, Bound] = {"step": COUNT, "tokens_generated": COUNT, "seconds": SECONDS, "accuracy": FRACTION}
"""The fields of one point of a run's curve in results.json."""


class RecordError(UserError):
    """A record credo wrote holds something credo would not have written there; the message names the file."""


def number(value: Any, where: str, bound: Bound = (-INF, INF, False)) -> float:
    """`value` when it is a finite JSON number within `bound` (an integer if it says so); else RecordError naming
    `where` (the file and the field)."""
    low, high, integer = bound
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RecordError(f"{where} is {value!r}, not a number")
    if not math.isfinite(value):
        raise RecordError(f"{where} is {value}, not a finite number")
    if integer and value != int(value):
        raise RecordError(f"{where} is {value}, not a whole number")
    if not low <= value <= high:
        raise RecordError(f"{where} is {value}, outside [{low:g}, {high:g}]")
    return value


def checked_record(record: Any, path: str, fields: dict[str, Bound], line: int | None = None,
                   required: tuple[str, ...] = ()) -> dict[str, Any]:
    """`record` (a JSON object read from `path`, at `line` of a JSONL file) after checking each of `fields` it
    holds, and that it holds every one of `required`."""
    where = f"{path}:{line}" if line is not None else path
    if not isinstance(record, dict):
        raise RecordError(f"{where}: a JSON {type(record).__name__}, not a record of fields")
    for name in required:
        if name not in record:
            raise RecordError(f"{where}: lacks the field {name!r}")
    for name, bound in fields.items():
        if name in record:
            number(record[name], f"{where}: {name}", bound)
    return record


def read_record(path: str, fields: dict[str, Bound], required: tuple[str, ...] = ()) -> dict[str, Any]:
    """The JSON object in `path`, checked (checked_record); a file that does not parse is one line naming it."""
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except (ValueError, UnicodeDecodeError) as err:
        raise RecordError(f"{path} is not valid JSON ({err})") from None
    return checked_record(record, path, fields, required=required)


def check_run_result(result: Any, where: str) -> None:
    """One run's entry of results.json (RESULT_FIELDS, and each point of its curve), `where` naming it."""
    checked_record(result, where, RESULT_FIELDS, required=("final_accuracy", "curve"))
    curve = result["curve"]
    if not isinstance(curve, list):
        raise RecordError(f"{where}: curve is {type(curve).__name__}, not a list of points")
    for i, point in enumerate(curve):
        checked_record(point, f"{where}: curve[{i}]", CURVE_FIELDS)
