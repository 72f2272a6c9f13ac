from __future__ import annotations

from pathlib import Path

import pytest

from seqrec.config import DataConfig, EvalConfig, RunConfig, load_config
from seqrec.errors import ConfigError


def test_defaults_file_then_overrides(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('[data]\nmin_user_interactions = 3\n[eval]\nprotocols = ["full"]\n')
    cfg = load_config(RunConfig, f, ["data.min_user_interactions=7", "eval.ks=[1, 20]"])
    assert cfg.data == DataConfig(min_user_interactions=7)
    assert cfg.eval == EvalConfig(protocols=("full",), ks=(1, 20))


def test_errors_name_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config\.data: unknown key\(s\) colour"):
        load_config(RunConfig, None, ["data.colour=1"])
    with pytest.raises(
        ConfigError, match=r"config\.data\.min_user_interactions: expected an integer"
    ):
        load_config(RunConfig, None, ["data.min_user_interactions=five"])
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(RunConfig, tmp_path / "none.toml")
    with pytest.raises(ConfigError, match=r"expected section\.key=value"):
        load_config(RunConfig, None, ["nonsense"])


def test_configs_are_frozen() -> None:
    cfg = RunConfig()
    with pytest.raises(AttributeError):
        cfg.data.min_user_interactions = 3  # type: ignore[misc]


def test_shipped_configs_parse() -> None:
    root = Path(__file__).parent.parent / "configs"
    files = sorted(root.glob("*.toml"))
    assert files
    for f in files:
        assert load_config(RunConfig, f) == RunConfig()  # they document the defaults
