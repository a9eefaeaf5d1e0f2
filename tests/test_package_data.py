"""The data kvlab needs at run time ships inside the package and is found through importlib.resources.

tests/test_wheel_install.py checks the same from a wheel, outside the checkout; these checks are fast.
"""
from __future__ import annotations

import fnmatch
import tomllib
from importlib import resources
from pathlib import Path

import pytest

import kvlab
from kvlab import data
from kvlab.http import server
from kvlab.serving import cost_model
from kvlab.experiments import recall
from kvlab.model import lessons as lesson_models
from kvlab import traces as workload  # the Azure sample and its reader live in kvlab.traces

LESSONS = ("03",)  # the lessons these tests belong to: `pytest -m lNN`

REPO = Path(__file__).resolve().parents[1]


def test_the_shipped_files_are_found_inside_the_kvlab_package():
    root = data.data_dir()
    assert root == Path(str(resources.files("kvlab.data"))) and root.parent == Path(kvlab.__file__).parent
    assert (data.shipped(data.RECALL_TINY) / "model.safetensors").is_file()
    assert recall.RECALL_MODEL_DIR == root / "recall-tiny"
    assert cost_model.CALIBRATION_DIR == root / "calibration" and cost_model.calibration_path("llama-30m").is_file()
    assert workload.SAMPLE_TRACE == root / "traces" / "azure_conv_sample.csv" and workload.SAMPLE_TRACE.is_file()


def test_pyproject_declares_every_shipped_file_as_package_data():
    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["kvlab.data"]
    root = data.data_dir()
    files = [p.relative_to(root).as_posix() for p in root.rglob("*")
             if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".py"]
    assert files, "kvlab/data holds no data files"
    undeclared = [f for f in files if not any(fnmatch.fnmatch(f, g) for g in globs)]
    assert not undeclared, f"not declared in [tool.setuptools.package-data] 'kvlab.data' of pyproject.toml: {undeclared}"


def test_nothing_reads_data_from_the_source_tree_any_more():
    # the top-level data/ holds only what a user downloads (data/README.md); nothing kvlab ships is left there
    root = data.data_dir()
    shipped = [p.relative_to(root) for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    stray = [f"data/{p.as_posix()}" for p in shipped if (REPO / "data" / p).exists()]
    assert not stray, f"data/ moved to kvlab/data/ (package data); remove the stray copies {stray}"
    offenders = [str(p.relative_to(REPO)) for p in (REPO / "kvlab").rglob("*.py")
                 if '/ "data"' in p.read_text(encoding="utf-8")]
    assert not offenders, f"use kvlab.data.data_path(...) instead of a path built from __file__: {offenders}"


def test_a_missing_shipped_file_names_itself_and_how_to_get_it_back():
    with pytest.raises(FileNotFoundError, match=r"recall-tiny/no-such-file.*reinstall kvlab.*train_recall.py"):
        data.shipped("recall-tiny/no-such-file")
    message = data.missing_message("traces/azure_conv_sample.csv")
    assert "make_sample_trace.py" in message and str(data.data_dir()) in message


def test_a_missing_recall_checkpoint_is_an_error_not_a_random_model(tmp_path, monkeypatch):
    monkeypatch.setattr(lesson_models, "RECALL_MODEL_DIR", tmp_path / "recall-tiny")  # where the checkpoint loads from
    with pytest.raises(FileNotFoundError, match="recall-tiny.*train_recall.py"):
        recall.load_recall_model()
    with pytest.raises(FileNotFoundError, match="recall-tiny.*train_recall.py"):
        server.load_model(None)  # `python -m kvlab serve` without --model: no silent tiny_llama stand-in


def test_an_explicit_path_still_loads_a_checkpoint():
    model = recall.load_recall_model(path=str(data.shipped(data.RECALL_TINY)), device="cpu")
    assert model.config.name == "recall-tiny"
    decoder, name = server.load_model(str(data.shipped(data.RECALL_TINY)), device="cpu")
    assert name == "recall-tiny" and decoder.num_parameters() == model.num_parameters()


def test_a_missing_sample_trace_or_calibration_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setattr(workload, "SAMPLE_TRACE", tmp_path / "azure_conv_sample.csv")
    with pytest.raises(FileNotFoundError, match="make_sample_trace.py"):
        workload.read_trace(workload.SAMPLE_TRACE)
    with pytest.raises(ValueError, match="no shipped calibration for 'no-such-model'.*kvlab calibrate --out"):
        cost_model.load_calibration("no-such-model")
