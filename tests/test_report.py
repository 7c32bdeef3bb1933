"""`python -m minirl.report`: runs found under a directory, folded into one row per configuration, compared with a
baseline, and written as a table, HTML, CSV and JSON. The runs here are written by hand, as the trainer and the
entry point write them (metrics.jsonl, heldout.jsonl, job.json), so every number is known; tests/test_sweeps.py
folds real sweeps."""

from __future__ import annotations

import csv
import io
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from statistics import fmean, stdev

import pytest

from minirl.inspection.files import HELDOUT_FILE, METRICS_FILE
from minirl.inspection.job import JOB_FILE, JobStatus, job_status, write_job
from minirl.inspection.plots import Series, line_plot
from minirl.reporting.fold import fold
from minirl.reporting.runs import find_runs
from minirl.stats import mean_sd, sign_test_p

pytestmark = pytest.mark.fast
TASKS = [f"t{i}" for i in range(8)]


def write_run(
    path: Path,
    overrides: list[str],
    evals: dict[int, float],
    solved_end: list[int] | None = None,
    status: str = "finished",
    error: str | None = None,
    tokens: float = 100.0,
    step_s: float = 2.0,
    wall_s: float = 60.0,
    pid: int | None = None,
) -> Path:
    """A run directory as a finished training run leaves it: two training steps, evaluations at `evals`' steps."""
    path.mkdir(parents=True)
    rows = [{"step": step, "eval/success_rate": value} for step, value in evals.items()]
    step_rows = (
        {"step": s, "reward/mean": 0.1 * s, "rollout/sampled_tokens": tokens, "time/step_s": step_s} for s in (1, 2)
    )
    rows += step_rows
    (path / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in sorted(rows, key=lambda r: r["step"])))
    if solved_end is not None:
        held = [{"step": 0, "tasks": TASKS, "solved": [0] * len(TASKS)}]
        held.append({"step": 2, "tasks": TASKS, "solved": solved_end})
        (path / HELDOUT_FILE).write_text("".join(json.dumps(r) + "\n" for r in held))
    record = {"status": status, "overrides": overrides, "wall_s": wall_s, "error": error, "host": socket.gethostname()}
    record["pid"] = pid if pid is not None else os.getpid()
    write_job(path, record)
    return path


@pytest.fixture
def sweep(tmp_path) -> Path:
    """2 losses x 3 seeds; cispo seed 2 failed; every held-out task list matches."""
    root = tmp_path / "sweep"
    values = {("grpo", 0): (0.30, 0.40), ("grpo", 1): (0.30, 0.45), ("grpo", 2): (0.30, 0.35)}
    values |= {("cispo", 0): (0.30, 0.50), ("cispo", 1): (0.30, 0.55)}
    solved = {
        ("grpo", 0): [1, 1, 0, 0, 0, 0, 0, 0],
        ("grpo", 1): [1, 1, 1, 0, 0, 0, 0, 0],
        ("cispo", 0): [1, 1, 1, 1, 0, 0, 0, 0],
        ("cispo", 1): [1, 0, 1, 1, 1, 0, 0, 0],
    }
    num = 0
    for loss in ("grpo", "cispo"):
        for seed in (0, 1, 2):
            overrides = ["debug=cpu", f"loss={loss}", f"trainer.seed={seed}"]
            if (loss, seed) not in values:
                write_run(root / str(num), overrides, {0: 0.30}, status="failed", error="TrainingError: boom <b>")
            else:
                start, end = values[loss, seed]
                evals = {0: start, 1: (start + end) / 2 + 0.1, 2: end}  # the best is step 1's
                write_run(root / str(num), overrides, evals, solved.get((loss, seed)), tokens=100.0 * (seed + 1))
            num += 1
    return root


def test_runs_are_found_in_job_order_with_their_overrides_and_status(sweep):
    (sweep / "10").mkdir()  # a directory that is not a run
    runs = find_runs(sweep)
    assert [run.path.name for run in runs] == ["0", "1", "2", "3", "4", "5"]
    assert runs[3].overrides == {"debug": "cpu", "loss": "cispo", "trainer.seed": "0"}
    assert [run.status for run in runs] == ["finished"] * 5 + ["failed"]
    assert runs[5].error == "TrainingError: boom <b>"


def test_seeds_fold_into_mean_sd_and_n_per_configuration(sweep):
    table = fold(find_runs(sweep), "eval/success_rate", ["trainer.seed"])
    assert table.varying == ["loss"]
    grpo, cispo = table.rows
    assert grpo.config == {"loss": "grpo"} and cispo.config == {"loss": "cispo"}
    ends = [0.40, 0.45, 0.35]
    assert grpo.stats["end"].mean == pytest.approx(fmean(ends)) and grpo.stats["end"].sd == pytest.approx(stdev(ends))
    assert grpo.stats["end"].n == 3 and cispo.stats["end"].n == 2  # the failed run counts in no figure
    assert grpo.stats["gain"].mean == pytest.approx(fmean(e - 0.30 for e in ends))
    assert grpo.stats["best"].mean == pytest.approx(fmean((0.30 + e) / 2 + 0.1 for e in ends))
    assert grpo.stats["steps"].mean == 2 and grpo.stats["wall_s"].mean == 60
    assert grpo.stats["tokens_per_s"].mean == pytest.approx(fmean([50.0, 100.0, 150.0]))  # 2 x tokens over 2 x 2 s
    assert cispo.status == {"finished": 2, "failed": 1}


def test_a_baseline_row_gives_paired_differences_and_the_pooled_sign_test(sweep):
    table = fold(find_runs(sweep), "eval/success_rate", ["trainer.seed"], {"loss": "grpo"})
    assert table.baseline is table.rows[0] and table.rows[0].vs_baseline is None
    comparison = table.rows[1].vs_baseline
    assert comparison.diff.n == 2  # seeds 0 and 1: both finished in both rows
    assert comparison.diff.mean == pytest.approx(fmean([0.50 - 0.40, 0.55 - 0.45]))
    # seed 0: cispo solves t2, t3 more; seed 1: cispo t3, t4 more, grpo t1 more
    assert (comparison.tasks_gained, comparison.tasks_lost, comparison.task_pairs) == (4, 1, 2)
    assert comparison.p == pytest.approx(sign_test_p(4, 1))


def test_held_out_tasks_that_differ_are_not_paired(sweep):
    held = sweep / "3" / HELDOUT_FILE
    rows = [json.loads(line) for line in held.read_text().splitlines()]
    rows[-1]["tasks"] = [f"other{i}" for i in range(8)]
    held.write_text("".join(json.dumps(r) + "\n" for r in rows))
    comparison = fold(find_runs(sweep), "eval/success_rate", ["trainer.seed"], {"loss": "grpo"}).rows[1].vs_baseline
    assert comparison.task_pairs == 1 and (comparison.tasks_gained, comparison.tasks_lost) == (2, 1)  # seed 1 only


def test_a_baseline_must_match_exactly_one_row(sweep):
    with pytest.raises(ValueError, match="matches 0 configurations, not one; they are: loss=grpo; loss=cispo"):
        fold(find_runs(sweep), "eval/success_rate", ["trainer.seed"], {"loss": "gspo"})


def test_a_key_some_runs_do_not_set_names_a_configuration_of_its_own(tmp_path):
    write_run(tmp_path / "a" / "0", ["experiment=study", "loss=grpo"], {0: 0.3, 2: 0.4})
    write_run(tmp_path / "b" / "0", ["experiment=study_dapo"], {0: 0.3, 2: 0.5})
    table = fold(find_runs(tmp_path), "eval/success_rate", ["trainer.seed"])
    assert [row.config for row in table.rows] == [
        {"experiment": "study", "loss": "grpo"},
        {"experiment": "study_dapo", "loss": "-"},
    ]


def test_the_search_stops_at_a_run_directory_and_skips_what_a_run_holds(tmp_path):
    run = write_run(tmp_path / "run", ["loss=grpo"], {0: 0.3})
    (run / "checkpoints" / "step_000001").mkdir(parents=True)
    (run / "checkpoints" / "step_000001" / METRICS_FILE).write_text("")  # never a run of its own
    (run / "wandb" / "offline-run").mkdir(parents=True)
    assert [r.path for r in find_runs(tmp_path)] == [run]
    assert [r.path for r in find_runs(run)] == [run]  # a single run directory


def test_a_run_whose_process_is_gone_was_interrupted():
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    here = {"status": "running", "host": socket.gethostname(), "pid": gone.pid}
    assert job_status(here) is JobStatus.interrupted
    assert job_status({**here, "pid": os.getpid()}) is JobStatus.running
    assert job_status({**here, "host": "another-node"}) is JobStatus.running  # a cluster node: believed
    assert job_status({"status": "nonsense"}) is JobStatus.interrupted


def test_a_run_without_a_job_record_counts_as_unknown(tmp_path):
    run = write_run(tmp_path / "old", ["loss=grpo"], {0: 0.3, 2: 0.4})
    (run / JOB_FILE).unlink()
    (run / ".hydra").mkdir()
    (run / ".hydra" / "overrides.yaml").write_text("- loss=grpo\n- trainer.seed=0\n")
    [only] = find_runs(tmp_path)
    assert only.status == "unknown" and only.overrides == {"loss": "grpo", "trainer.seed": "0"}
    assert fold([only], "eval/success_rate", ["trainer.seed"]).rows[0].stats["end"].mean == pytest.approx(0.4)


def report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "minirl.report", *args], capture_output=True, text=True, timeout=120
    )  # fmt: skip


def test_the_command_prints_the_table_and_writes_html_markdown_csv_and_json(sweep, tmp_path):
    out = tmp_path / "out"
    proc = report(str(sweep), "--baseline", "loss=grpo", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "loss=grpo" in proc.stdout and "2/3 (1 failed)" in proc.stdout
    assert "failed" in proc.stdout and "TrainingError: boom <b>" in proc.stdout
    assert "40.0 ± 5.0" in proc.stdout  # grpo's end: mean 40.0, sd 5.0 points
    page = (out / "report.html").read_text()
    assert "TrainingError: boom &lt;b&gt;" in page and "<b>boom" not in page  # run text is escaped
    assert page.count("<svg") == 3 and "polygon" in page  # the metric's curve and two training curves, with bands
    data = json.loads((out / "report.json").read_text())
    assert data["rows"][1]["vs_baseline"]["tasks_gained"] == 4
    assert data["rows"][0]["stats"]["end"]["mean"] == pytest.approx(0.40)
    lines = list(csv.DictReader(io.StringIO((out / "report.csv").read_text())))
    assert [line["loss"] for line in lines] == ["grpo", "cispo"] and lines[1]["failed"] == "1"
    assert float(lines[1]["sign_test_p"]) == pytest.approx(sign_test_p(4, 1))
    assert "| loss | n | step 0 |" in (out / "report.md").read_text()
    assert (out / "learning_curves.svg").read_text().startswith("<svg")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{empty}"], "no runs under"),
        (["{sweep}", "--baseline", "loss=dapo"], "--baseline loss=dapo matches 0 configurations"),
        (["{missing}"], "no directory at"),
    ],
)
def test_the_command_says_what_is_wrong_in_one_line(sweep, tmp_path, args, message):
    (tmp_path / "empty").mkdir()
    paths = {"empty": tmp_path / "empty", "sweep": sweep, "missing": tmp_path / "missing"}
    proc = report(*(a.format(**paths) for a in args))
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


def test_mean_sd_of_one_value_has_no_spread():
    assert mean_sd([0.5]) == (0.5, None)
    assert mean_sd([0.3, 0.5]) == pytest.approx((0.4, stdev([0.3, 0.5])))


def test_a_plot_shades_each_band_and_wraps_a_long_legend():
    band = [(0, 0.3, 0.3), (10, 0.35, 0.45)]
    series = [Series(f"experiment=loss_study loss={name}", [(0, 0.3), (10, 0.4)], band) for name in "abcd"]
    svg = line_plot(series, "success", "step", "points", y_range=(0, 1), percent=True)
    assert svg.count("<polygon") == 4
    assert 'height="316"' in svg  # two entries a row: one legend row more than the 300 px plot has room for


def test_a_baseline_of_true_or_false_matches_a_sweeps_recorded_value_in_any_case(tmp_path):
    for num, guide in enumerate(("True", "False")):  # what Hydra records for algo.guide=true,false
        write_run(tmp_path / str(num), [f"algo.guide={guide}"], {0: 0.3, 2: 0.4 + 0.1 * num})
    table = fold(find_runs(tmp_path), "eval/success_rate", ["trainer.seed"], {"algo.guide": "false"})
    assert table.baseline.config == {"algo.guide": "False"}
    assert table.rows[0].vs_baseline.diff.mean == pytest.approx(-0.1)
