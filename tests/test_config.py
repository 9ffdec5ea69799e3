"""Settings: one source of defaults and bounds; file < environment < flags."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from app.config import (
    ConfigError,
    Settings,
    add_section_flags,
    load_settings,
    overrides_from_args,
    save_settings,
)


def test_defaults_without_any_source(tmp_path: Path) -> None:
    s = load_settings(tmp_path / "missing.toml", environ={})
    assert s == Settings()
    assert s.engine.n_ctx == 0  # sized by the fit where the engine process starts
    assert s.draft.mode == "auto"


def test_layers_file_env_flags(tmp_path: Path) -> None:
    file = tmp_path / "config.toml"
    file.write_text('[engine]\nn_ctx = 8192\nn_batch = 256\n[draft]\nmode = "ngram"\n')
    env = {"FORESIGHT_ENGINE__N_CTX": "16384", "FORESIGHT_ENGINE__TENSOR_SPLIT": "3,1", "OTHER": "x"}
    s = load_settings(file, overrides={"draft": {"max_draft": 4}}, environ=env)
    assert s.engine.n_ctx == 16384  # env beats file
    assert s.engine.n_batch == 256  # file beats default
    assert s.engine.tensor_split == [3.0, 1.0]
    assert (s.draft.mode, s.draft.max_draft) == ("ngram", 4)


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("[engine]\nn_ctx = 10\n", "n_ctx"),
        ('[draft]\nmode = "magic"\n', "mode"),
        ("[engine]\nunknown = 1\n", "unknown"),
        ("[engine\n", "not valid TOML"),
    ],
)
def test_bad_values_are_refused_with_the_field(tmp_path: Path, toml: str, message: str) -> None:
    file = tmp_path / "config.toml"
    file.write_text(toml)
    with pytest.raises(ConfigError, match=message):
        load_settings(file, environ={})


def test_flags_derive_from_the_fields(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_section_flags(parser, "engine", ["n_ctx", "device"])
    add_section_flags(parser, "draft", ["max_draft", "adaptive", "ngram_min"])
    args = parser.parse_args(["--n-ctx", "2048", "--no-adaptive", "--ngram-min", "3"])
    over = overrides_from_args(args)
    assert over == {"engine": {"n_ctx": 2048}, "draft": {"adaptive": False, "ngram_min": 3}}
    s = load_settings(tmp_path / "none.toml", overrides=over, environ={})
    assert s.engine.n_ctx == 2048
    assert s.draft.adaptive is False
    assert "context length in tokens" in parser.format_help()


def test_save_writes_only_changes_and_loads_back(tmp_path: Path) -> None:
    file = tmp_path / "sub" / "config.toml"
    s = Settings()
    s.engine.n_ctx = 8192
    s.engine.tensor_split = [3.0, 1.0]
    s.draft.adaptive = False
    s.draft.mode = "ngram"
    s.sampling.top_p = 0.5
    s.sampling.seed = 2**63 - 1
    s.server.cors_origin = 'http://a "quoted" \\ host\x7f\tü'
    assert save_settings(s, file) == file
    assert load_settings(file, environ={}) == s
    text = file.read_text(encoding="utf-8")
    assert "[engine]" in text
    assert "n_batch" not in text  # defaults stay in the code
    assert "[models]" not in text
    assert [p.name for p in file.parent.iterdir()] == ["config.toml"]  # no temp file left behind
    save_settings(Settings(), file)
    assert file.read_text() == ""
    assert load_settings(file, environ={}) == Settings()
