"""gpu/jobs.sh: detached runs that outlive the command starting them, their status and logs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

JOBS_SH = Path(__file__).resolve().parents[2] / "gpu" / "jobs.sh"


def _jobs(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(JOBS_SH), *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "VP_HOME": str(tmp_path / "home"), **env})


def test_a_job_outlives_its_starter_and_reports_its_status(tmp_path):
    started = _jobs(tmp_path, "start", "slow", "bash", "-c", "sleep 1; echo done; exit 3")
    assert started.returncode == 0, started.stderr
    assert not (tmp_path / "home" / "jobs" / "slow.rc").exists()  # the starter returned before the job ended
    waited = _jobs(tmp_path, "wait", "30")
    assert "== slow: ended, exit 3" in waited.stdout and "done" in waited.stdout


def test_wait_returns_at_its_limit_while_a_job_runs(tmp_path):
    _jobs(tmp_path, "start", "long", "sleep", "20")
    waited = _jobs(tmp_path, "wait", "1")
    assert "== long: running" in waited.stdout
    pid = int((tmp_path / "home" / "jobs" / "long.pid").read_text())
    os.killpg(pid, 15)


def test_collect_copies_logs_and_reports(tmp_path):
    report = tmp_path / "reports"
    report.mkdir()
    (report / "r.md").write_text("x")
    _jobs(tmp_path, "start", "quick", "echo", "hello")
    _jobs(tmp_path, "wait", "30")
    out = tmp_path / "out"
    assert _jobs(tmp_path, "collect", str(out), VP_REPORT=str(report)).returncode == 0
    assert (out / "quick.log").read_text() == "hello\n" and (out / "r.md").exists()


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    for args in (["start", "a/b", "true"], ["start", "name"], ["wait", "soon"], ["nope"]):
        done = _jobs(tmp_path, *args)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, (args, done.stderr)
