"""Progress (deploy/progress.py): the compiler reports stages and kernel counts to the reporter it
is given and is silent without one; the command line draws a status line on a terminal only,
writes JSON lines with --log-json, and leaves stdout as it was."""
from __future__ import annotations

import io
import json
import os
import pty
import re
import subprocess
import sys

import deploy
import onnx
import pytest
from deploy.progress import Event, JsonLines, Progress, TerminalProgress, as_progress

from tests.test_cli import deploy_cli, mlp_model

STAGES = ["import", "optimize", "lower", "render+build", "package"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("progress")
    onnx.save(mlp_model(), d / "mlp.onnx")
    return d


def _starts(events) -> list[str]:
    return [e.stage for e in events if e.event == "start"]


def test_the_api_is_silent_and_reports_to_the_reporter_it_is_given(capsys, tmp_path):
    deploy.compile(mlp_model(), shapes={"x": (3, 12)}, tune="quick",
                   tuning_db=str(tmp_path / "db.jsonl"), budget="20s")
    assert capsys.readouterr() == ("", "")  # tuning included: nothing printed
    events = []
    art = deploy.compile(mlp_model(), shapes={"x": (3, 12)}, progress=events.append)
    assert _starts(events) == STAGES
    assert [e.stage for e in events if e.event == "end"] == STAGES
    assert all(e.seconds >= 0 for e in events if e.event == "end")
    n = art.manifest["kernel_count"]
    for step in ("render", "build"):
        counts = [(e.done, e.total) for e in events if e.step == step]
        assert counts[0] == (0, n) and counts[-1] == (n, n), (step, counts)
        assert all(e.stage == "render+build" for e in events if e.step == step)
    assert capsys.readouterr() == ("", "")


def test_tuning_reports_kernels_gain_and_budget_left(tmp_path):
    events, lines = [], []
    deploy.compile(mlp_model(), shapes={"x": (32, 12)}, tune="quick", budget="30s",
                   tuning_db=str(tmp_path / "db.jsonl"), progress=events.append,
                   log=lines.append)
    assert _starts(events) == ["import", "optimize", "lower", "tune", "render+build", "package"]
    tune = [e for e in events if e.step == "tune"]
    assert tune and tune[-1].done == tune[-1].total >= 1
    assert all(e.info["gain"] > 0 and 0 <= e.info["left_s"] <= e.info["budget_s"] == 30
               for e in tune)
    logged = [e.info["message"] for e in events if e.event == "log"]
    assert lines and logged == lines  # the tuner's lines: to ``log`` and as events


def test_gpu_build_and_tuning_report_progress():
    pytest.importorskip("triton")
    from tests.test_gpu_tuning import FakeMeasure, _model
    events = []
    art = deploy.compile(_model(), target="h100", aot=False, tune="quick",
                         measure=FakeMeasure(), progress=events.append)
    n = art.manifest["kernel_count"]
    assert [(e.done, e.total) for e in events if e.step == "render"][-1] == (n, n)
    assert [e for e in events if e.step == "tune"][-1].done >= 1
    assert "check" in _starts(events)


def test_a_function_or_a_reporter_or_nothing():
    assert type(as_progress(None)) is Progress
    got = []
    as_progress(got.append).count("render", 1, 2)
    assert got == [Event("progress", "", "render", 1, 2, got[0].seconds, {"unit": "kernels"})]
    with pytest.raises(deploy.DeployError, match="progress="):
        as_progress(3)


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_terminal_line_shows_stage_counts_and_tuning():
    term = FakeTerminal()
    with TerminalProgress(term) as p:
        p.begin("render+build")
        for i in range(4):
            p.count("render", i, 3)
        p.end("render+build", 0.1)
        p.begin("tune")
        p.count("tune", 2, 5, gain=1.234, left_s=61.0, budget_s=600.0)
        p.tuner_log(lambda line: term.write(line + "\n"))("tune [2/5] a line")
    text = term.getvalue()
    assert "render+build [00:00]" in text and "render: 3/3 kernels" in text
    assert "tune: 2/5 kernels" in text and "gain 1.23x, 1:01 left of 10:00]" in text
    assert "tune [2/5] a line\n" in text


def test_json_lines_thin_progress_but_keep_first_and_last():
    out = io.StringIO()
    p = JsonLines(out, interval=60)
    p.begin("render+build")
    for i in range(101):
        p.count("render", i, 100)
    p.end("render+build", 1.0)
    rows = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["event"] for r in rows] == ["start", "progress", "progress", "end"]
    assert [r.get("done") for r in rows[1:3]] == [0, 100]
    assert rows[1]["unit"] == "kernels" and rows[-1]["seconds"] == 1.0


# ---- the command line --------------------------------------------------------------------------

def test_cli_without_a_terminal_is_clean_and_log_json_parses(model_dir):
    plain = deploy_cli("compile", "mlp.onnx", "--shape", "x=3x12", "-o", "a.dpk", cwd=model_dir)
    assert plain.returncode == 0 and plain.stderr == ""
    logged = deploy_cli("compile", "mlp.onnx", "--shape", "x=3x12", "-o", "b.dpk", "--log-json",
                        cwd=model_dir)
    assert logged.returncode == 0, logged.stderr
    assert _same_but_times(logged.stdout, plain.stdout)
    rows = [json.loads(line) for line in logged.stderr.splitlines()]
    assert [r["stage"] for r in rows if r["event"] == "start"] == [*STAGES, "save"]
    assert all({"event", "stage", "elapsed"} <= set(r) for r in rows)
    render = [r for r in rows if r.get("step") == "render"]
    assert render[-1]["done"] == render[-1]["total"] >= 1
    quiet = deploy_cli("compile", "mlp.onnx", "--shape", "x=3x12", "-o", "c.dpk", "--quiet",
                       cwd=model_dir)
    assert quiet.returncode == 0 and quiet.stderr == ""


def _same_but_times(a: str, b: str) -> bool:
    """Equal once the seconds are taken out."""
    def strip(s):
        return re.sub(r"\d+\.\d+s", "Ts", s).replace("b.dpk", "a.dpk")
    return strip(a) == strip(b)


def _on_a_terminal(args, cwd) -> tuple[int, str, str]:
    """Run ``python -m deploy ARGS`` with stderr on a pseudo-terminal: (rc, stdout, stderr)."""
    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "deploy", *args], cwd=cwd, stdout=subprocess.PIPE,
                         stderr=slave, env=dict(os.environ, TERM="xterm"))
    os.close(slave)
    out = p.stdout.read().decode()
    err = b""
    while True:
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:  # the other side closed
            break
        if not chunk:
            break
        err += chunk
    os.close(master)
    return p.wait(timeout=300), out, err.decode(errors="replace")


def test_cli_on_a_terminal_draws_progress_on_stderr_only(model_dir):
    rc, out, err = _on_a_terminal(["compile", "mlp.onnx", "--shape", "x=3x12", "-o", "t.dpk"],
                                  model_dir)
    assert rc == 0, err
    assert "import [" in err and "render: " in err and "build: " in err
    assert out.startswith("compiled mlp.onnx for host") and "\r" not in out
    rc, out, err = _on_a_terminal(["compile", "mlp.onnx", "--shape", "x=3x12", "-o", "q.dpk",
                                   "-q"], model_dir)
    assert rc == 0 and err.strip() == "" and out.startswith("compiled")


def test_bench_reports_runs(model_dir):
    deploy.compile(str(model_dir / "mlp.onnx"), shapes={"x": (3, 12)}).save(model_dir / "m.dpk")
    r = deploy_cli("bench", "m.dpk", "--runs", "5", "--warmup", "2", "--json", "--log-json",
                   cwd=model_dir)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["deploy"]["runs"] == 5
    rows = [json.loads(line) for line in r.stderr.splitlines()]
    assert [x["stage"] for x in rows if x["event"] == "start"] == ["load", "deploy"]
    runs = [x for x in rows if x.get("step") == "runs"]
    assert runs[-1]["done"] == runs[-1]["total"] == 5 and runs[-1]["unit"] == "runs"

