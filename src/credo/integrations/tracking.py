"""Experiment trackers: a run's metrics rows, its config and its final summary, also sent to TensorBoard,
Weights & Biases, MLflow or Trackio (`report_to`; none by default).

`metrics.jsonl` stays the record: a tracker gets a copy of each row as it is appended (the numbers of the row,
nested keys joined with '/', at the row's `step`), the config once when the run opens, and `summary.json`'s
numbers when it finishes. Each tracker writes to a local store, so it works with no network and no account:

  tensorboard  event files in <root>/tensorboard/<run>/ (`tensorboard --logdir <root>/tensorboard`)
  wandb        an offline run in <root>/wandb/ (`wandb sync <root>/wandb/offline-run-*`), unless WANDB_MODE says
               otherwise; project $WANDB_PROJECT or 'credo', group = the comparison
  mlflow       a file store <root>/mlruns (`mlflow ui --backend-store-uri <root>/mlruns`), unless
               MLFLOW_TRACKING_URI names another; one experiment per comparison ('credo' for a lone run)
  trackio      trackio's own local store (TRACKIO_DIR, default ~/.cache/huggingface/trackio); one project per
               comparison ('credo' for a lone run)

<root> is the run directory of a `credo train` run and the comparison's --out for `credo compare`, whose runs are
each their own tracker run, named after their run directory (`grpo-s0`) and grouped by the comparison (the
basename of --out). A resumed run reopens its trackers at its checkpoint's step: TensorBoard hides the rows the
interrupted process logged past it (purge_step); W&B, MLflow and Trackio get a new tracker run of the same name
that continues from that step. Each backend's package is an optional extra (`pip install 'credo[wandb]'`).

Before a run touches its directory (check_trackers), a local store's folder that is a file, and a remote MLflow
server that does not answer within CONNECT_TIMEOUT seconds, are one line naming the tracker; a tracker that fails
to open, or later to log, is one too (TrackerError), raised before the first step for the opening. In a comparison
it stops the comparison (rerun it once fixed) rather than failing every method.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
from urllib.parse import urlparse
from typing import Any, Callable, Iterable, Iterator

from credo.core.config import ConfigError, to_dict
from credo.integrations.trackers import TRACKERS, Tracker, TrackingPlace

PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow", "trackio": "trackio"}
"""The import each tracker needs; the extra that installs it has the tracker's name (`credo[mlflow]`)."""
STORES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlruns"}
"""The folder under a run's tracking root each local store writes (mlflow's unless MLFLOW_TRACKING_URI is set)."""
CONNECT_TIMEOUT = 10.0
"""Seconds a remote tracker (an http(s) MLFLOW_TRACKING_URI) gets to answer a connection, and each MLflow request
(MLFLOW_HTTP_REQUEST_TIMEOUT, unless set), so an unreachable server is an error, not a run waiting at step 0."""


class TrackerError(ConfigError):
    """A tracker could not be opened or written; the message names it."""


def checked_names(names: Iterable[str], field: str) -> tuple[str, ...]:
    """`names` when each is a registered tracker, named once (('none',) alone, as in TRL's report_to, is no
    tracker); else a ConfigError naming `field` and the allowed names."""
    names = list(names)
    if names == ["none"]:
        return ()
    known = TRACKERS.names()
    if "none" in names:  # 'none' is allowed, but only alone: with a tracker it would mean two things
        raise ConfigError(f"{field}: none means no tracker, so it stands alone; got {','.join(names)} (name the "
                          f"trackers, of {', '.join(known)}, or none)")
    for name in names:
        if name not in known:
            raise ConfigError(f"{field}: unknown tracker {name!r}; allowed: {', '.join(known)} (or none alone)")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"{field} names {', '.join(twice)} twice")
    return tuple(names)


def check_installed(names: Iterable[str], field: str) -> None:
    """Every tracker in `names` has its package installed; else a ConfigError saying which extra to install."""
    for name in names:
        if importlib.util.find_spec(PACKAGES[name]) is None:
            raise ConfigError(f"{field}: {name} is not installed; install it with: pip install 'credo[{name}]'")


def check_trackers(names: Iterable[str], field: str, place: "TrackingPlace") -> None:
    """Before a run starts: each named tracker is installed (check_installed), its local store under `place.root`
    is a folder where it exists (not a file), and a remote MLflow server answers within CONNECT_TIMEOUT; else a
    ConfigError (TrackerError) naming `field`."""
    check_installed(names, field)
    for name in names:
        uri = os.environ.get("MLFLOW_TRACKING_URI", "") if name == "mlflow" else ""
        store = os.path.join(place.root, STORES[name]) if name in STORES and not uri else ""
        for path in (store, os.path.join(store, place.run_name)) if store else ():
            if os.path.exists(path) and not os.path.isdir(path):
                raise TrackerError(f"{field}: {name} keeps its store in {path}, which is a file, not a folder; "
                                   "move it away")
        if urlparse(uri).scheme in ("http", "https"):
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(int(CONNECT_TIMEOUT)))
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
            parsed = urlparse(uri)
            try:
                port = parsed.port or (443 if parsed.scheme == "https" else 80)
                socket.create_connection((parsed.hostname or "", port), timeout=CONNECT_TIMEOUT).close()
            except (OSError, ValueError) as err:
                raise TrackerError(f"{field}: mlflow cannot reach MLFLOW_TRACKING_URI={uri} ({err}; waited at "
                                   f"most {CONNECT_TIMEOUT:g} s)") from None


@contextlib.contextmanager
def named_failure(name: str, what: str) -> Iterator[None]:
    """A tracker's own exception (a missing API key, a server gone, a folder it cannot write) as one TrackerError
    naming the tracker and what it was doing."""
    try:
        yield
    except Exception as err:
        if isinstance(err, TrackerError):
            raise
        first = " ".join(str(err).split())[:300]
        raise TrackerError(f"report_to {name}: {what} failed ({type(err).__name__}: {first})") from None


def open_trackers(config: Any, place: TrackingPlace, resume_step: int | None,
                  log: Any) -> tuple["Trackers | None", Any]:
    """(the trackers, the metrics log) of a run with TrainConfig `config` whose tracker stores are at `place`
    (resume_step: the checkpoint step a resumed run goes on from, None for a new run): (None, `log`) when it
    reports to none, else its open trackers and `log` wrapped to copy each appended row to them."""
    if not config.report_to:
        return None, log
    place = TrackingPlace(place.root, place.run_name, place.group, resume_step)
    trackers = Trackers(config.report_to, place, to_dict(config))
    return trackers, TrackedLog(log, trackers)


class TrackedLog:
    """A run's metrics log (credo.core.files.MetricsLog) whose appended rows also go to its trackers, after the
    record is written; everything else is the log's own."""

    def __init__(self, log: Any, trackers: "Trackers") -> None:
        self.log, self.trackers = log, trackers

    def append(self, row: dict[str, Any], tracked_only: dict[str, float] | None = None) -> None:
        """row to the record and the trackers; tracked_only: more metrics of the row for the trackers alone."""
        self.log.append(row)
        self.trackers.log_metrics({**row, **(tracked_only or {})})

    def __getattr__(self, name: str) -> Any:
        return getattr(self.log, name)


@contextlib.contextmanager
def closing_trackers(owner: Any) -> Any:
    """Closes `owner.trackers` (if any were opened) when the block ends; as failed when it ends on an error."""
    try:
        yield
    except BaseException:
        if owner.trackers is not None:
            owner.trackers.close(failed=True)
        raise
    if owner.trackers is not None:
        owner.trackers.close()


class Trackers:
    """The trackers `report_to` names, opened together, each row and the summary sent to all of them."""

    def __init__(self, names: Iterable[str], place: TrackingPlace, config: dict[str, Any]) -> None:
        self.trackers: list[tuple[str, Tracker]] = []
        try:
            for name in names:
                opener: Callable[..., Tracker] = TRACKERS.get(name).fn
                with named_failure(name, "opening the tracker"):
                    self.trackers.append((name, opener(place, config)))
        except BaseException:
            self.close(failed=True)
            raise

    def log_metrics(self, row: dict[str, Any]) -> None:
        for name, tracker in self.trackers:
            with named_failure(name, f"logging step {row.get('step')}"):
                tracker.log_metrics(row)

    def log_summary(self, summary: dict[str, Any]) -> None:
        for name, tracker in self.trackers:
            with named_failure(name, "logging the summary"):
                tracker.log_summary(summary)

    def close(self, failed: bool = False) -> None:
        """Close every tracker (each once; a later call does nothing; a tracker that fails to close is left, so
        the error that ended the run is the one reported)."""
        trackers, self.trackers = self.trackers, []
        for name, tracker in trackers:
            if failed:
                with contextlib.suppress(Exception):
                    tracker.close(failed)
            else:
                with named_failure(name, "closing the tracker"):
                    tracker.close(failed)
