"""A stand-in for a comparison's training worker, light enough to spawn in a test: it holds its run's lock and
trains (sleeps) until it is stopped. Importable by a spawned process (tests/ is on its sys.path)."""

from __future__ import annotations

import os
import time

from credo.train.interrupts import worker_task
from credo.core.outputs import run_lock


def train_forever(method: str, seed: int, preset: object, start: str, run_dir: str, threads: int,
                  report_to: tuple[str, ...] = ()) -> None:
    with worker_task(), run_lock(run_dir):
        with open(os.path.join(run_dir, f"started-{os.getpid()}"), "w"):
            pass
        while True:
            time.sleep(0.05)
