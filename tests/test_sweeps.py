"""Hydra multiruns of the real trainer (the debug preset, CPU), read back by `python -m minirl.report`: a 2 x 3
sweep folded into its jobs' own numbers, a failing job that leaves the others to finish, a rerun that skips the
finished jobs and resumes one killed with SIGKILL, an Optuna search run 2 trials at a time by the joblib launcher,
and a sweep through submitit's local executor; then what a job of a sweep sets on its config (W&B group and name,
threads) and the objective it returns."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from statistics import fmean, stdev

import pytest
import torch
import yaml
from omegaconf import OmegaConf
from rich.console import Console
from support import debug_config

from minirl.config import Resume, SweepConfig
from minirl.inspection.files import METRICS_FILE, read_metrics
from minirl.inspection.job import JobStatus, job_status, read_job
from minirl.sweep import Job, JobConflict, cores, objective, thread_share
from minirl.tracking import Tracker

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}


def train(cache_dir: Path, sweep_dir: Path, *overrides: str, check: bool = True) -> subprocess.CompletedProcess:
    command = [
        sys.executable, "-m", "minirl.train", "-m", "debug=cpu", f"model.cache_dir={cache_dir}",
        f"hydra.sweep.dir={sweep_dir}", *overrides,
    ]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=ENV, timeout=900)
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def report(root: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    """The report's console output, and its report.json."""
    command = [sys.executable, "-m", "minirl.report", str(root), *args]
    proc = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = Path(args[args.index("--out") + 1]) if "--out" in args else root
    return proc, json.loads((out / "report.json").read_text())


def jobs(sweep_dir: Path) -> list[Path]:
    return sorted((p for p in sweep_dir.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))


def overrides_of(job: Path) -> dict[str, str]:
    return dict(o.split("=", 1) for o in yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text()))


def values(rows: list[dict], key: str) -> list[tuple[int, float]]:
    return [(row["step"], row[key]) for row in rows if key in row]


def sorted_ends(sweep: Path, loss: str) -> list[float]:
    """The last held-out success rate of each seed's job of `loss`, in seed order."""
    mine = sorted((overrides_of(job)["trainer.seed"], job) for job in jobs(sweep) if overrides_of(job)["loss"] == loss)
    return [values(read_metrics(job / METRICS_FILE), "eval/success_rate")[-1][1] for _, job in mine]


@pytest.mark.slow
def test_a_2x3_sweep_folds_into_the_numbers_of_its_jobs_metrics_files(cache_dir, tmp_path):
    sweep = tmp_path / "sweep"
    train(cache_dir, sweep, "loss=grpo,cispo", "trainer.seed=0,1,2", "trainer.steps=3")
    records = [read_job(job) for job in jobs(sweep)]
    assert len(records) == 6 and {r["status"] for r in records} == {"finished"}
    assert {r["cpu_capability"] for r in records} == {torch.backends.cpu.get_cpu_capability()}  # what rounding follows
    proc, table = report(sweep, "--baseline", "loss=grpo")
    assert "eval/success_rate (points): mean ± sd over trainer.seed" in proc.stdout
    assert (sweep / "report.html").is_file() and "learning_curves.svg" in proc.stdout
    _, by_grad = report(sweep, "--metric", "grad_norm", "--out", str(tmp_path / "grad_norm"))

    for loss, row, grad_row in zip(("grpo", "cispo"), table["rows"], by_grad["rows"]):
        assert row["config"] == {"loss": loss} and row["status"] == {"finished": 3}
        mine = [read_metrics(job / METRICS_FILE) for job in jobs(sweep) if overrides_of(job)["loss"] == loss]
        success = [values(rows, "eval/success_rate") for rows in mine]
        ends, starts = [s[-1][1] for s in success], [s[0][1] for s in success]
        assert row["stats"]["end"]["mean"] == pytest.approx(fmean(ends))
        assert row["stats"]["gain"]["mean"] == pytest.approx(fmean(e - s for e, s in zip(ends, starts)))
        speeds = [
            sum(v for _, v in values(rows, "rollout/sampled_tokens")) / sum(v for _, v in values(rows, "time/step_s"))
            for rows in mine
        ]
        assert row["stats"]["tokens_per_s"]["mean"] == pytest.approx(fmean(speeds))
        assert row["stats"]["tokens_per_s"]["sd"] == pytest.approx(stdev(speeds))
        assert row["stats"]["steps"]["mean"] == 3
        grads = [values(rows, "grad_norm") for rows in mine]  # every step, different for every seed and loss
        assert grad_row["stats"]["end"]["mean"] == pytest.approx(fmean(g[-1][1] for g in grads))
        assert grad_row["stats"]["end"]["sd"] == pytest.approx(stdev(g[-1][1] for g in grads))
        assert grad_row["stats"]["best"]["mean"] == pytest.approx(fmean(max(v for _, v in g) for g in grads))
        assert grad_row["stats"]["start"] is None  # no gradient at step 0
    # against loss=grpo, seed by seed: the held-out tasks of each job's last evaluation (heldout.jsonl)
    last = {}
    for job in jobs(sweep):
        heldout = [json.loads(line) for line in (job / "heldout.jsonl").read_text().splitlines()]
        last[overrides_of(job)["loss"], overrides_of(job)["trainer.seed"]] = heldout[-1]["solved"]
    pairs = [(last["cispo", seed], last["grpo", seed]) for seed in "012"]
    comparison = table["rows"][1]["vs_baseline"]
    assert comparison["task_pairs"] == 3
    assert comparison["tasks_gained"] == sum(a > b for mine, base in pairs for a, b in zip(mine, base))
    assert comparison["tasks_lost"] == sum(a < b for mine, base in pairs for a, b in zip(mine, base))
    diffs = [e - b for e, b in zip(*(sorted_ends(sweep, loss) for loss in ("cispo", "grpo")))]
    assert comparison["diff_end"]["mean"] == pytest.approx(fmean(diffs))


@pytest.mark.slow
def test_a_failing_job_leaves_the_others_to_finish_and_a_rerun_skips_the_finished_ones(cache_dir, tmp_path):
    sweep = tmp_path / "sweep"
    args = ("trainer.seed=0,1", "trainer.nan_loss_steps=[1],[]", "trainer.max_bad_steps=1", "logger.backend=wandb")
    proc = train(cache_dir, sweep, *args, check=False)
    assert proc.returncode != 0  # the sweep ends with the failure, after every job ran
    assert "job 0 (trainer.seed=0 trainer.nan_loss_steps=[1]) failed: TrainingError" in proc.stdout
    records = [read_job(job) for job in jobs(sweep)]
    assert [r["status"] for r in records] == ["failed", "finished", "failed", "finished"]
    assert records[0]["error"].startswith("TrainingError: steps 1-1: every one had a non-finite loss")
    assert "Traceback" in records[0]["traceback"]
    assert (jobs(sweep)[3] / "checkpoint").is_dir()  # the job after the failures ran to its end

    # W&B: the sweep directory as the group, the swept overrides as the name (in the offline run's records)
    [run_file] = (jobs(sweep)[3] / "wandb").glob("offline-run-*/run-*.wandb")
    recorded = run_file.read_bytes()
    assert str(sweep).encode() in recorded and b"trainer.seed=1 trainer.nan_loss_steps=[]" in recorded

    _, table = report(sweep)
    failed = next(row for row in table["rows"] if row["config"]["trainer.nan_loss_steps"] == "[1]")
    assert failed["status"] == {"failed": 2} and failed["stats"]["end"] is None
    assert all(run["error"].startswith("TrainingError") for run in failed["runs"])

    finished_at = [(job / METRICS_FILE).stat().st_mtime_ns for job in jobs(sweep)]
    rerun = train(cache_dir, sweep, *args, check=False)
    assert "job 1 (trainer.seed=0 trainer.nan_loss_steps=[]) finished before" in rerun.stdout
    assert "job 0 (trainer.seed=0 trainer.nan_loss_steps=[1]): its last attempt failed" in rerun.stdout
    again = [read_job(job) for job in jobs(sweep)]
    assert [r["attempts"] for r in again] == [2, 1, 2, 1]
    assert (jobs(sweep)[1] / METRICS_FILE).stat().st_mtime_ns == finished_at[1]  # skipped: untouched


@pytest.mark.slow
def test_a_config_error_in_one_jobs_values_fails_that_job_alone(cache_dir, tmp_path):
    sweep = tmp_path / "sweep"
    proc = train(cache_dir, sweep, "trainer.lr=-1,3e-4", "trainer.steps=1", check=False)
    assert proc.returncode != 0 and "job 0 (trainer.lr=-1) failed: ConfigError: trainer.lr: must be > 0" in proc.stdout
    first, second = (read_job(job) for job in jobs(sweep))
    assert (first["status"], first["error"]) == ("failed", "ConfigError: trainer.lr: must be > 0")
    assert second["status"] == "finished" and second["objective"] is not None


@pytest.mark.slow
def test_a_sweep_killed_in_a_job_resumes_that_job_and_skips_the_finished_one(cache_dir, tmp_path):
    sweep, steps = tmp_path / "sweep", 12
    args = ("trainer.seed=0,1", f"trainer.steps={steps}", "trainer.eval_every=4", "trainer.save_every=1")
    train(cache_dir, tmp_path / "warm", "trainer.steps=1")  # the debug model is built before the clock starts
    command = [
        sys.executable, "-m", "minirl.train", "-m", "debug=cpu", f"model.cache_dir={cache_dir}",
        f"hydra.sweep.dir={sweep}", *args,
    ]  # fmt: skip
    proc = subprocess.Popen(command, cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = sweep / "1" / METRICS_FILE
    while proc.poll() is None:
        if metrics.exists() and metrics.read_text().count('"time/step_s"') >= 3:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the sweep ended before job 1 had run 3 steps"
    record = read_job(sweep / "1")
    assert record["status"] == "running" and job_status(record) is JobStatus.interrupted

    rerun = train(cache_dir, sweep, *args)
    assert "job 0 (trainer.seed=0) finished before" in rerun.stdout
    assert "job 1 (trainer.seed=1): its last attempt was interrupted; running it again" in rerun.stdout
    assert "resuming from" in rerun.stdout
    rows = read_metrics(metrics)
    assert [r["step"] for r in rows if "time/step_s" in r] == list(range(1, steps + 1))  # each step once
    assert [r["step"] for r in rows if "eval/success_rate" in r] == [0, 4, 8, 12]
    assert read_job(sweep / "1")["status"] == "finished" and read_job(sweep / "1")["attempts"] == 2


@pytest.mark.slow
def test_an_optuna_search_runs_its_6_trials_2_at_a_time_with_joblib_and_reports_the_best(cache_dir, tmp_path):
    sweep = tmp_path / "search"
    proc = subprocess.run(
        [sys.executable, "-m", "minirl.train", "hparams_search=lr_clip", "debug=cpu", f"model.cache_dir={cache_dir}",
         f"hydra.sweep.dir={sweep}"],
        capture_output=True, text=True, cwd=REPO, env={k: v for k, v in ENV.items() if k != "OMP_NUM_THREADS"},
        timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [read_job(job) for job in jobs(sweep)]
    assert len(records) == 6 and {r["status"] for r in records} == {"finished"}
    assert {r["threads"] for r in records} == {max(1, cores() // 2)}  # each job its share, not every core
    for first, second in zip(records[::2], records[1::2]):  # a batch of 2 trials: two processes at once
        assert first["pid"] != second["pid"]
        assert first["started"] < second["ended"] and second["started"] < first["ended"]
    assert {override.split("=")[0] for override in records[0]["swept"]} == {"trainer.lr", "loss.clip_high"}
    best = OmegaConf.load(sweep / "optimization_results.yaml")
    assert set(best.best_params) == {"trainer.lr", "loss.clip_high"}
    printed, table = report(sweep)
    assert "Optuna's best trial" in printed.stdout and len(table["rows"]) == 6

    rerun = subprocess.run(proc.args, capture_output=True, text=True, cwd=REPO, env=ENV, timeout=900)
    assert rerun.returncode == 0 and rerun.stdout.count("finished before") == 6  # the same seeded trials
    assert OmegaConf.load(sweep / "optimization_results.yaml") == best


@pytest.mark.slow
def test_submitit_local_runs_a_sweep_of_2_jobs_in_processes_of_their_own(cache_dir, tmp_path):
    sweep = tmp_path / "sweep"
    train(cache_dir, sweep, "hydra/launcher=submitit_local", "trainer.seed=0,1")
    records = [read_job(job) for job in jobs(sweep)]
    assert [r["status"] for r in records] == ["finished", "finished"] and records[0]["pid"] != records[1]["pid"]
    assert (sweep / ".submitit").is_dir()
    _, table = report(sweep)
    assert table["rows"][0]["status"] == {"finished": 2}


def test_a_sweep_job_names_its_wandb_run_groups_it_and_takes_its_share_of_threads(cache_dir, tmp_path):
    cfg = debug_config(cache_dir, tmp_path, "logger.backend=wandb")
    job = Job(tmp_path, "train", ["debug=cpu", "loss=cispo", "trainer.seed=1"], ["loss", "trainer.seed"],
              multirun=True, num=3, sweep_dir="multirun/losses", threads=1)  # fmt: skip
    assert job.prepare(cfg, Console(quiet=True)) is False
    assert (cfg.logger.group, cfg.logger.run_name) == ("multirun/losses", "loss=cispo trainer.seed=1")
    assert cfg.trainer.threads == 1 and cfg.trainer.resume is Resume.never
    tracker = Tracker(cfg, tmp_path, Console(quiet=True))
    run = tracker.backend.run
    assert (run.group, run.name) == ("multirun/losses", "loss=cispo trainer.seed=1")
    assert run.config["overrides"] == {"debug": "cpu", "loss": "cispo", "trainer.seed": "1"}
    tracker.close()


def test_a_job_in_a_directory_of_another_job_is_refused_and_its_record_kept(cache_dir, tmp_path):
    Job(tmp_path, "train", ["loss=grpo"], [], multirun=True, num=0, sweep_dir="s", threads=0).start()
    job = Job(tmp_path, "train", ["loss=cispo"], [], multirun=True, num=0, sweep_dir="s", threads=0)
    job.previous = read_job(tmp_path)
    with pytest.raises(JobConflict, match="holds the job `loss=grpo`, not `loss=cispo`"):
        job.prepare(debug_config(cache_dir, tmp_path), Console(quiet=True))
    assert read_job(tmp_path)["overrides"] == ["loss=grpo"]


@pytest.mark.fast
def test_joblib_and_submitit_give_each_job_its_share_of_the_cores():
    joblib = "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"
    assert thread_share(OmegaConf.create({"_target_": joblib, "n_jobs": 2})) == max(1, cores() // 2)
    assert thread_share(OmegaConf.create({"_target_": joblib, "n_jobs": -1})) == 1  # a job per core
    submitit = "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    assert thread_share(OmegaConf.create({"_target_": submitit, "cpus_per_task": 8})) == 8
    basic = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"
    assert thread_share(OmegaConf.create({"_target_": basic})) == 0  # one job at a time: torch's own choice


@pytest.mark.fast
def test_the_objective_is_the_mean_of_the_last_values_of_the_metric(tmp_path):
    rows = [{"step": 0, "eval/success_rate": 0.2}, {"step": 5, "loss/kl": 0.1}, {"step": 10, "eval/success_rate": 0.4}]
    (tmp_path / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert objective(tmp_path, SweepConfig()) == pytest.approx(0.4)
    assert objective(tmp_path, SweepConfig(objective_window=2)) == pytest.approx(0.3)
    assert objective(tmp_path, SweepConfig(objective="eval/reward/mean")) is None
