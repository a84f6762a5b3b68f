"""Shared by the trust tests: a malicious pickle, directory snapshots, one-line CLI errors, tiny runs."""

from __future__ import annotations

import hashlib
import os
import pickle

from credo.cli.main import main
from credo.train.trainer import Trainer, load_train_config

FAST = ["eval_n=4", "final_eval_n=4", "eval_every=2", "checkpoint_every=2", "prompts_per_step=2", "group_size=3",
        "sampling.max_new_tokens=12", "lr=1e-3"]


class Payload:
    """Unpickling this runs a shell command that creates `marker`: what a crafted run directory could do."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def malicious_pickle(path: str, marker: str) -> None:
    with open(path, "wb") as f:
        pickle.dump(Payload(marker), f)


def payload_is_live(tmp_path) -> bool:
    """The payload really executes when unpickled (so a test that it was not executed means something)."""
    marker = str(tmp_path / "live-check")
    malicious_pickle(str(tmp_path / "live.pkl"), marker)
    with open(tmp_path / "live.pkl", "rb") as f:
        pickle.load(f)  # noqa: S301 - deliberately, on our own file
    live = os.path.exists(marker)
    os.remove(marker)
    return live


def snapshot(root: str) -> dict[str, str]:
    """relative path -> sha256 of every file under root (directories as '<dir>')."""
    out = {}
    for base, dirs, files in os.walk(root):
        for d in dirs:
            out[os.path.relpath(os.path.join(base, d), root)] = "<dir>"
        for name in files:
            path = os.path.join(base, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return out


def one_line_error(capsys, argv: list[str]) -> str:
    """Run the CLI; assert it failed as a user error (exit 2, exactly one line on stderr); return that line."""
    capsys.readouterr()
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    lines = [line for line in err if not line.startswith(("jsonl task: skipped",))]
    assert code == 2, f"exit {code}, stderr {err}"
    assert len(lines) == 1, f"expected one line, got {err}"
    assert lines[0].startswith(f"credo {argv[0]}: error: ")
    return lines[0]


def train_config(start: str, *extra: str):
    return load_train_config(None, ["method=grpo", f"start={start}", "steps=4", *FAST, *extra])


def killed_run(start: str, run_dir: str, *extra: str, stop_after: int = 3) -> Trainer:
    """A run that stopped after `stop_after` steps (checkpoint at step 2, no final/)."""
    trainer = Trainer(train_config(start, *extra), run_dir, progress=False)
    trainer.train(stop_after=stop_after)
    return trainer
