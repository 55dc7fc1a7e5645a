"""`specdec fetch-models`: every model in its own directory, the completion marker written only
once all are there (and removed while a refill runs), clear refusals. The hub is not reachable
here: the download is a stand-in that writes what snapshot_download would."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdec.cli import app
from specdec.cli.fetch_models import COMPLETE, fetch


def _hub(weights: bool = True):
    calls = []

    def download(repo: str, local_dir: str, allow_patterns: list[str]) -> str:
        calls.append(repo)
        assert "*.safetensors" in allow_patterns and "*.json" in allow_patterns
        Path(local_dir).mkdir(parents=True, exist_ok=True)
        (Path(local_dir) / "config.json").write_text("{}")
        if weights:
            (Path(local_dir) / "model.safetensors").write_bytes(b"")
        return local_dir

    return download, calls


def test_each_model_gets_its_directory_and_the_marker_comes_last(tmp_path):
    download, calls = _hub()
    (tmp_path / COMPLETE).write_text("old\n")
    dirs = fetch(["Qwen/Qwen3-8B", "Qwen/Qwen3-0.6B"], tmp_path, download)
    assert dirs == [tmp_path / "Qwen3-8B", tmp_path / "Qwen3-0.6B"] and calls == ["Qwen/Qwen3-8B", "Qwen/Qwen3-0.6B"]
    assert (tmp_path / COMPLETE).read_text() == "Qwen/Qwen3-8B\nQwen/Qwen3-0.6B\n"


def test_a_model_without_weights_fails_and_leaves_no_marker(tmp_path):
    download, _ = _hub(weights=False)
    (tmp_path / COMPLETE).write_text("old\n")
    with pytest.raises(RuntimeError, match="no safetensors weights"):
        fetch(["org/gguf-only"], tmp_path, download)
    assert not (tmp_path / COMPLETE).exists()  # pods keep waiting rather than load half a pair


def test_the_command_refuses_two_models_of_one_name_and_needs_a_directory(tmp_path, capsys):
    assert app.main(["fetch-models", "--to", str(tmp_path), "a/model", "b/model"]) == 2
    assert "share a directory name" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        app.main(["fetch-models", "a/model"])  # --to is required
