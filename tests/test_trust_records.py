"""Numbers read back from credo's own records are checked as they are read (credo.core.records): a string, a
bool, a NaN or an out-of-range value where credo writes a number is one line naming the file and the field."""

from __future__ import annotations

import json
import math

import pytest

from credo.core.files import MetricsLog, read_jsonl
from credo.core.records import (COUNT, FRACTION, METRICS_FIELDS, RecordError, check_run_result, number,
                                read_record)


@pytest.mark.parametrize("value, bound, says", [
    ("0.4", FRACTION, "is '0.4', not a number"), (True, COUNT, "is True, not a number"),
    (None, COUNT, "is None, not a number"), (math.nan, FRACTION, "is nan, not a finite number"),
    (math.inf, COUNT, "is inf, not a finite number"), (2.5, COUNT, "is 2.5, not a whole number"),
    (1.5, FRACTION, "is 1.5, outside [0, 1]"), (-1, COUNT, "is -1, outside [0, inf]")])
def test_a_number_that_credo_would_not_have_written_is_refused_by_name(value, bound, says):
    with pytest.raises(RecordError, match=f"^f.json: x {says}$".replace("[", r"\[").replace("]", r"\]")):
        number(value, "f.json: x", bound)
    assert number(0.25, "f", FRACTION) == 0.25 and number(3, "f", COUNT) == 3 and number(3.0, "f", COUNT) == 3.0


def test_metrics_rows_are_checked_with_their_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "seconds": 0.0, "eval_accuracy": 0.3}\n{"step": 1, "grad_norm": NaN}\n')
    with pytest.raises(RecordError, match=r"metrics.jsonl:2: grad_norm is nan, not a finite number"):
        MetricsLog(str(path)).rows()
    with pytest.raises(RecordError, match=r"metrics.jsonl:2: grad_norm is nan"):
        MetricsLog(str(path)).rows_up_to(1)  # what a resume reads
    path.write_text('{"step": 0}\n[1, 2]\n')
    with pytest.raises(RecordError, match=r"metrics.jsonl:2: a JSON list, not a record of fields"):
        MetricsLog(str(path)).rows()
    assert read_jsonl(str(path)) == [{"step": 0}, [1, 2]]  # without fields: rows as they are (a data file)
    assert METRICS_FIELDS["eval_accuracy"] == FRACTION


def test_a_summary_and_a_results_entry_are_checked(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({"step": 3, "final_accuracy": "0.9"}))
    with pytest.raises(RecordError, match=r"summary.json: final_accuracy is '0.9', not a number"):
        read_record(str(path), {"final_accuracy": FRACTION})
    with pytest.raises(RecordError, match=r"summary.json: lacks the field 'seconds'"):
        read_record(str(path), {}, required=("seconds",))
    path.write_text("{")
    with pytest.raises(RecordError, match=r"summary.json is not valid JSON"):
        read_record(str(path), {})
    entry = {"final_accuracy": 0.5, "curve": [{"step": 0, "accuracy": 0.3}, {"step": 2, "accuracy": math.nan}]}
    with pytest.raises(RecordError, match=r"^r: curve\[1\]: accuracy is nan, not a finite number$"):
        check_run_result(entry, "r")
    check_run_result({**entry, "curve": entry["curve"][:1]}, "r")  # no error
