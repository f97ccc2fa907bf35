"""flashlab.course.run_notebooks: every chapter executed on this machine, outcome recorded per notebook."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from flashlab.course import run_notebooks
from flashlab.lab import results
from flashlab.lab.measure import gpu_tag
from flashlab.course.run_notebooks import run_notebook


def _notebook(path: Path, *sources: str) -> Path:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


def test_a_notebook_that_runs_is_ok_and_its_copy_holds_the_outputs(tmp_path: Path) -> None:
    src = _notebook(tmp_path / "good.ipynb", "x = 6 * 7", "print(x)")
    row = run_notebook(src, tmp_path / "out")
    assert row["status"] == "ok" and row["error"] == "" and row["seconds"] >= 0
    executed = nbformat.read(tmp_path / "out" / "good.ipynb", as_version=4)
    assert executed.cells[1].outputs[0]["text"] == "42\n"
    assert not nbformat.read(src, as_version=4).cells[1].outputs, "the source notebook must stay untouched"


def test_a_failing_cell_is_reported_with_its_error(tmp_path: Path) -> None:
    src = _notebook(tmp_path / "bad.ipynb", "print('first')", "raise ValueError('q: expected 4 dims, got 3')", "print('never')")
    row = run_notebook(src, tmp_path / "out")
    assert row["status"] == "error"
    assert "ValueError" in row["error"] and "expected 4 dims" in row["error"]
    executed = nbformat.read(tmp_path / "out" / "bad.ipynb", as_version=4)
    assert not executed.cells[2].outputs, "execution stops at the failing cell"


def test_missing_notebook_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="path: expected a notebook file"):
        run_notebook(tmp_path / "nope.ipynb", tmp_path / "out")


def test_command_line_rejects_unknown_names_and_bad_jobs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        run_notebooks.main(["--out", str(tmp_path), "99_no_such_chapter"])
    assert exc.value.code == 2 and "names: expected notebooks" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run_notebooks.main(["--out", str(tmp_path), "--jobs", "0"])
    assert "--jobs: expected a positive number" in capsys.readouterr().err


def test_command_line_runs_a_chapter_and_records_it(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert run_notebooks.main(["--out", str(tmp_path), "--results", str(tmp_path / "rec"), "02_online_softmax"]) == 0
    assert "02_online_softmax.ipynb" in capsys.readouterr().out
    assert (tmp_path / "02_online_softmax.ipynb").is_file()
    rec = results.load(f"notebooks_{gpu_tag()}", tmp_path / "rec")
    assert [(r["notebook"], r["status"]) for r in rec.rows] == [("02_online_softmax.ipynb", "ok")]
    assert rec.meta["command"].startswith("python -m flashlab.course.run_notebooks")


def test_result_stems_are_named_for_the_gpu() -> None:
    from flashlab.lab.measure import gpu_tag

    assert gpu_tag("NVIDIA H200") == "h200"
    assert gpu_tag("NVIDIA GeForce RTX 4090") == "rtx-4090"
    assert gpu_tag("NVIDIA H100 80GB HBM3") == "h100-80gb-hbm3"
