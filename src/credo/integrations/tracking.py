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
import json
import os
import socket
import sys
import time
from urllib.parse import urlparse
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

from credo.core.config import ConfigError, to_dict
from credo.core.registry import Registry

TRACKERS = Registry("tracker")
"""The trackers `report_to` names, found by name; each entry's fn opens one (TrackingPlace, config) -> Tracker."""

PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow", "trackio": "trackio"}
"""The import each tracker needs; the extra that installs it has the tracker's name (`credo[mlflow]`)."""
STORES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlruns"}
"""The folder under a run's tracking root each local store writes (mlflow's unless MLFLOW_TRACKING_URI is set)."""
CONNECT_TIMEOUT = 10.0
"""Seconds a remote tracker (an http(s) MLFLOW_TRACKING_URI) gets to answer a connection, and each MLflow request
(MLFLOW_HTTP_REQUEST_TIMEOUT, unless set), so an unreachable server is an error, not a run waiting at step 0."""


class TrackerError(ConfigError):
    """A tracker could not be opened or written; the message names it."""


@dataclass(frozen=True)
class TrackingPlace:
    """Where a run's trackers write. root: the folder of the local stores (a run directory, or a comparison's
    --out). run_name: the tracker run's name. group: the comparison it belongs to ('' for a lone run).
    resume_step: the checkpoint step a resumed run continues from (None for a run that starts at step 0)."""

    root: str
    run_name: str
    group: str = ""
    resume_step: int | None = None

    @classmethod
    def for_run(cls, run_dir: str) -> "TrackingPlace":
        """A lone `credo train` run: its stores inside its own directory, the run named after it."""
        return cls(root=run_dir, run_name=os.path.basename(os.path.abspath(run_dir)))

    @property
    def project(self) -> str:
        """The experiment (MLflow) or project (Trackio) of the run: its comparison's, or 'credo'."""
        return self.group or "credo"


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


def metric_items(row: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The numbers of a metrics row or summary (nested mappings flattened to 'a/b'), as floats, each name after
    `prefix`; its `step` is the x axis, not a metric, and text is left out."""
    return _numbers({k: v for k, v in row.items() if k != "step"}, prefix)


def _numbers(tree: dict[str, Any], prefix: str) -> dict[str, float]:
    items: dict[str, float] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            items.update(_numbers(value, f"{prefix}{key}/"))
        elif isinstance(value, (int, float)):  # bool is an int: logged as 0/1
            items[f"{prefix}{key}"] = float(value)
    return items


def flat_config(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested config as {dotted path: JSON text}, for trackers whose parameters are flat strings."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            flat.update(flat_config(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = json.dumps(value)
    return flat


class Tracker:
    """One open tracker run. `log_metrics` gets each metrics.jsonl row, `log_summary` summary.json's content,
    `close` ends the tracker run (failed: the training stopped on an error)."""

    def log_metrics(self, row: dict[str, Any]) -> None:
        raise NotImplementedError

    def log_summary(self, summary: dict[str, Any]) -> None:
        raise NotImplementedError

    def close(self, failed: bool = False) -> None:
        raise NotImplementedError


@TRACKERS.register("tensorboard", "TensorBoard event files in <root>/tensorboard/<run>/")
class TensorBoardTracker(Tracker):
    """Scalars by their metrics.jsonl name at the row's step; the config and the summary as text, the summary's
    numbers also as scalars `summary/<name>` at the final step."""

    def __init__(self, place: TrackingPlace, config: dict[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter  # optional, heavy: only when asked for
        # a resumed run logs again every step after its checkpoint: purge_step hides what the interrupted
        # process had logged from there on, as metrics.jsonl is cut back to the checkpoint
        purge = place.resume_step + 1 if place.resume_step is not None else None
        self.writer = SummaryWriter(log_dir=os.path.join(place.root, "tensorboard", place.run_name), purge_step=purge)
        if place.resume_step is None:
            self.writer.add_text("config", _as_code(json.dumps(config, indent=2)), 0)
        self.writer.flush()

    def log_metrics(self, row: dict[str, Any]) -> None:
        for name, value in metric_items(row).items():
            self.writer.add_scalar(name, value, int(row["step"]))
        self.writer.flush()  # a row a step: a comparison's curves are current while it runs

    def log_summary(self, summary: dict[str, Any]) -> None:
        step = int(summary.get("step", 0))
        for name, value in metric_items(summary).items():
            self.writer.add_scalar(f"summary/{name}", value, step)
        self.writer.add_text("summary", _as_code(json.dumps(summary, indent=2)), step)

    def close(self, failed: bool = False) -> None:
        self.writer.close()


@TRACKERS.register("wandb", "a Weights & Biases run, offline in <root>/wandb/ unless WANDB_MODE says otherwise")
class WandbTracker(Tracker):
    """A W&B run: the config as its config, each row with `step` as W&B's step, the summary as its summary."""

    def __init__(self, place: TrackingPlace, config: dict[str, Any]) -> None:
        import wandb  # optional, heavy: only when asked for
        self.wandb = wandb
        # offline unless the user chose a mode: a run must never wait on (or fail for) the network
        mode = os.environ.get("WANDB_MODE") or "offline"
        self.run = wandb.init(mode=mode, dir=place.root, project=os.environ.get("WANDB_PROJECT") or "credo",
                              group=place.group or None, name=place.run_name, config=config, reinit="create_new",
                              settings=wandb.Settings(silent=True, console="off", x_disable_stats=True))

    def log_metrics(self, row: dict[str, Any]) -> None:
        self.run.log(metric_items(row), step=int(row["step"]))

    def log_summary(self, summary: dict[str, Any]) -> None:
        self.run.summary.update(summary)

    def close(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)


@TRACKERS.register("mlflow", "an MLflow run in the file store <root>/mlruns unless MLFLOW_TRACKING_URI names another")
class MLflowTracker(Tracker):
    """An MLflow run in the comparison's experiment: the config as parameters (dotted paths) and config.json,
    each row's numbers as metrics at its step, the summary as summary.json and metrics `summary/<name>`."""

    def __init__(self, place: TrackingPlace, config: dict[str, Any]) -> None:
        uri = os.environ.get("MLFLOW_TRACKING_URI") or _mlflow_file_store(os.path.join(place.root, "mlruns"))
        from mlflow.entities import Metric, Param  # optional, heavy: only when asked for
        from mlflow.tracking import MlflowClient
        self.Metric = Metric
        self.client = MlflowClient(tracking_uri=uri)
        experiment = _mlflow_experiment(self.client, place.project)
        self.run_id = self.client.create_run(experiment, run_name=place.run_name).info.run_id
        params = [Param(k, v[:6000]) for k, v in flat_config(config).items()]  # 6000: MLflow's value limit
        for start in range(0, len(params), 100):  # MLflow takes at most 100 parameters a batch
            self.client.log_batch(self.run_id, params=params[start:start + 100])
        self.client.log_dict(self.run_id, config, "config.json")

    def log_metrics(self, row: dict[str, Any]) -> None:
        self._log(metric_items(row), int(row["step"]))

    def log_summary(self, summary: dict[str, Any]) -> None:
        self._log(metric_items(summary, "summary/"), int(summary.get("step", 0)))
        self.client.log_dict(self.run_id, summary, "summary.json")

    def _log(self, items: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[self.Metric(k, v, now, step) for k, v in items.items()])

    def close(self, failed: bool = False) -> None:
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")


def _mlflow_file_store(path: str) -> str:
    """The file-store URI of `path`. MLflow 3 keeps its file store in maintenance mode behind an opt-in; credo
    opts in (unless the user decided) since it is the store that needs neither a server nor a database."""
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return "file://" + os.path.abspath(path)


def _mlflow_experiment(client: Any, name: str) -> str:
    """The id of experiment `name`, created if missing (a comparison's parallel runs may race to create it)."""
    from mlflow.exceptions import MlflowException
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name)
    except MlflowException:  # another run of the comparison created it first
        return client.get_experiment_by_name(name).experiment_id


@TRACKERS.register("trackio", "a Trackio run in trackio's local store (TRACKIO_DIR), project = the comparison")
class TrackioTracker(Tracker):
    """A Trackio run: the config as its config, each row's numbers at its step, the summary's numbers as
    `summary/<name>` at the final step. Trackio's messages go to stderr (stdout is the command's result)."""

    def __init__(self, place: TrackingPlace, config: dict[str, Any]) -> None:
        import trackio  # optional: only when asked for
        with contextlib.redirect_stdout(sys.stderr):
            self.run = trackio.init(project=place.project, name=place.run_name, group=place.group or None,
                                    config=config, embed=False, auto_log_gpu=False, auto_log_cpu=False,
                                    resume="allow")

    def log_metrics(self, row: dict[str, Any]) -> None:
        self.run.log(metric_items(row), step=int(row["step"]))

    def log_summary(self, summary: dict[str, Any]) -> None:
        self.run.log(metric_items(summary, "summary/"), step=int(summary.get("step", 0)))

    def close(self, failed: bool = False) -> None:
        from trackio import context_vars
        with contextlib.redirect_stdout(sys.stderr):
            self.run.finish()
        if context_vars.current_run.get() is self.run:  # else trackio's exit hook finishes it again, on stdout
            context_vars.current_run.set(None)


def _as_code(text: str) -> str:
    """Text shown as it is by TensorBoard's markdown renderer."""
    return "".join(f"    {line}\n" for line in text.splitlines())


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

    def append(self, row: dict[str, Any]) -> None:
        self.log.append(row)
        self.trackers.log_metrics(row)

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
