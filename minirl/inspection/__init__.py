"""Trajectory inspection: records of sampled trajectories (`trajectories.jsonl`), a W&B table form, a console
view and a static HTML run report, all showing which tokens carry the loss. `python -m minirl.inspect RUN_DIR`."""

from minirl.inspection.files import (
    METRICS_FILE,
    TRAJECTORIES_FILE,
    RunFileError,
    read_metrics,
    read_trajectories,
    select_records,
    write_trajectories,
)
from minirl.inspection.record import mask_runs, trajectory_record
from minirl.inspection.report import REPORT_FILE, render_report, write_report
from minirl.inspection.table import TABLE_COLUMNS, conversation_text, trajectory_table
from minirl.inspection.terminal import token_view, trajectory_panel

__all__ = [
    "METRICS_FILE",
    "REPORT_FILE",
    "TABLE_COLUMNS",
    "TRAJECTORIES_FILE",
    "RunFileError",
    "conversation_text",
    "mask_runs",
    "read_metrics",
    "read_trajectories",
    "render_report",
    "select_records",
    "token_view",
    "trajectory_panel",
    "trajectory_record",
    "trajectory_table",
    "write_report",
    "write_trajectories",
]
