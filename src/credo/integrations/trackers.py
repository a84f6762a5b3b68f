"""The tracker backends `report_to` names, each an entry of TRACKERS: TensorBoard, Weights & Biases, MLflow and
Trackio (credo.integrations.tracking opens them for a run and sends them its rows). Each backend's package is an
optional extra, imported when its tracker opens."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from credo.core.registry import Registry

TRACKERS = Registry("tracker")
"""The trackers `report_to` names, found by name; each entry's fn opens one (TrackingPlace, config) -> Tracker."""


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
