"""Run logging shared by every trainer: TensorBoard (SB3 tag names), progress.csv, histograms."""

from __future__ import annotations

import csv
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

EVENTS_GLOB = "events.out.tfevents.*"
"""TensorBoard event files written into a run folder."""


class RunLogger:
    """Collects scalars for one step, then writes them to TensorBoard and ``progress.csv``.

    Tags follow Stable-Baselines3 (``rollout/ep_rew_mean``, ``train/value_loss``,
    ``time/fps``...) so existing dashboards carry over. The CSV gets one row per :meth:`dump`;
    when a new tag appears the file is rewritten with the wider header, so columns never shift.

    :param run_dir: the run's folder; events go to ``run_dir`` itself, the CSV beside them.
    :param tensorboard: write TensorBoard events (the CSV is always written).
    :param on_dump: called with every written row (``{"step": step, tag: value, ...}``), e.g.
        to report to Ray Tune while the run trains.
    """

    def __init__(
        self,
        run_dir: str | Path,
        tensorboard: bool = True,
        on_dump: Callable[[dict[str, float]], None] | None = None,
    ) -> None:
        self.on_dump = on_dump
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.csv_path = self.run_dir / "progress.csv"
        self._pending: dict[str, float] = {}
        self._columns: list[str] = []
        self._rows: list[dict[str, Any]] = []
        if self.csv_path.is_file():  # resuming: keep earlier rows and columns
            with self.csv_path.open(newline="") as handle:
                reader = csv.DictReader(handle)
                self._columns = list(reader.fieldnames or [])
                self._rows = list(reader)
        # Event files of an earlier process (resume): rewritten by truncate_after().
        self._old_events = sorted(self.run_dir.glob(EVENTS_GLOB))
        self._writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(self.run_dir))

    def record(self, tag: str, value: float) -> None:
        """Queue a scalar for the next :meth:`dump`."""
        self._pending[tag] = float(value)

    def histogram(self, tag: str, values: torch.Tensor | list[float], step: int) -> None:
        """Write a histogram to TensorBoard right away (e.g. gate time scales)."""
        if self._writer is None:
            return
        tensor = torch.as_tensor(values).detach().float().cpu().flatten()
        tensor = tensor[torch.isfinite(tensor)]
        if tensor.numel():
            self._writer.add_histogram(tag, tensor, global_step=step)

    def dump(self, step: int) -> dict[str, float]:
        """Write the queued scalars at ``step``; returns what was written."""
        values = dict(self._pending)
        self._pending.clear()
        if not values:
            return values
        if self._writer is not None:
            for tag, value in values.items():
                if math.isfinite(value):
                    self._writer.add_scalar(tag, value, global_step=step)
            self._writer.flush()
        row = {"step": step, **values}
        new_columns = [c for c in row if c not in self._columns]
        self._rows.append(row)
        if new_columns or not self.csv_path.is_file():
            self._columns.extend(new_columns)
            self._rewrite_csv()
        else:
            with self.csv_path.open("a", newline="") as handle:
                csv.DictWriter(handle, fieldnames=self._columns).writerow(row)
        if self.on_dump is not None:
            self.on_dump(row)
        return values

    def truncate_after(self, step: int) -> None:
        """Drop what was logged beyond ``step`` (resuming from the checkpoint at ``step``).

        CSV rows after ``step`` are dropped; the earlier event files are copied, up to
        ``step``, into this logger's event file and deleted, so TensorBoard shows one point
        per step, as ``progress.csv`` does, however often a run was resumed.
        """
        self._rows = [r for r in self._rows if float(r.get("step", 0)) <= step]
        self._rewrite_csv()
        if self._writer is not None and self._old_events:
            file_writer = self._writer._get_file_writer()
            for path in self._old_events:
                for event in _read_events(path):
                    if event.step <= step and not event.HasField("file_version"):
                        file_writer.add_event(event, walltime=event.wall_time)
            file_writer.flush()
            for path in self._old_events:  # only once their content is safely copied
                path.unlink(missing_ok=True)
            self._old_events = []

    def _rewrite_csv(self) -> None:
        tmp = self.csv_path.with_suffix(".csv.tmp")
        with tmp.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=self._columns)
            writer.writeheader()
            for row in self._rows:
                writer.writerow({k: row.get(k, "") for k in self._columns})
        tmp.replace(self.csv_path)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _read_events(path: Path) -> list[Any]:
    """The events of one TensorBoard file; a record cut short by a kill ends the list."""
    from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader

    events = []
    try:
        for event in LegacyEventFileLoader(str(path)).Load():  # as written, not migrated
            events.append(event)
    except Exception:  # a truncated or corrupt tail (killed mid-write): keep what was read
        pass
    return events
