"""docs/troubleshooting.md quotes kvoffload's errors as users meet them: each quote is
reproduced here, so a reworded message cannot leave the page behind."""

import socket
from pathlib import Path

import pytest

from kvoffload.cli import main
from kvoffload.output_paths import check_output

PAGE = (Path(__file__).resolve().parent.parent / "docs" / "troubleshooting.md").read_text()


def _quoted(text: str) -> None:
    assert " ".join(text.split()) in " ".join(PAGE.split()), f"docs/troubleshooting.md does not quote: {text}"


def _error(argv: list[str], capsys) -> str:
    assert main(argv) == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def _yaml(tmp_path: Path, text: str) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return str(path)


def test_config_errors_are_quoted_as_printed(tmp_path, capsys):
    typo = _yaml(tmp_path, "tiers: [{name: cpu, medium: cpu, capacity: 64MiB, evicton_policy: lru}]\n")
    _quoted(_error(["config", "check", typo], capsys).split(": ", 2)[2])
    mode = _yaml(tmp_path, "tiers: [{medium: cpu, capacity: 1MiB}]\nload_mode: fast\n")
    _quoted(_error(["config", "check", mode], capsys).split(": ", 2)[2])
    missing = tmp_path / "no-such-mount" / "kvcache"
    fs = _yaml(tmp_path, f"tiers: [{{medium: cpu, capacity: 1MiB}}, {{medium: fs, capacity: 1GiB, path: {missing}}}]\n")
    line = _error(["config", "check", fs], capsys)
    _quoted(line.split(": ", 2)[2].replace(str(missing), "/mnt/shared/kvcache").split("? ")[0] + "?")
    _quoted(_error(["run", "--config", "nope.yaml"], capsys).removeprefix("error: "))


def test_a_disk_past_the_free_space_is_a_warning_in_config_check(tmp_path, capsys):
    big = _yaml(tmp_path, f"tiers: [{{medium: cpu, capacity: 1MiB}}, {{medium: disk, capacity: 200TiB, "
                          f"path: {tmp_path / 'kv'}}}]\n")
    assert main(["config", "check", big]) == 0
    warning = next(line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:"))
    assert "capacity 200.00 TiB exceeds the " in warning and "GiB free on its file system" in warning
    _quoted("warning: tiers[1].capacity: capacity 200.00 TiB exceeds the")


def test_plan_and_run_errors_are_quoted_as_printed(tmp_path, capsys):
    log = tmp_path / "live.jsonl"
    log.write_text('{"timestamp": 1, "prompt_token_ids": [1, 2, 3], "max_tokens": 4}\n{"timestamp": 2, "prompt_tok')
    _quoted(_error(["plan", "--log", str(log), "--model", "tiny", "--tiers", "cpu:1MiB"], capsys).removeprefix("error: "))
    bad = ["plan", "--log", str(log), "--model", "tiny", "--tiers", "cpu:1MiB+dsk:1GiB"]
    _quoted(_error(bad, capsys).removeprefix("error: "))
    _quoted(_error(["run", "--threads", "0"], capsys))


def test_a_taken_metrics_port_is_quoted_as_printed(capsys):
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        port = held.getsockname()[1]
        assert main(["run", "--model", "tiny", "--prometheus-port", str(port), "--conversations", "1",
                     "--turns", "1", "--max-tokens", "2"]) == 2
    _quoted(capsys.readouterr().err.strip().splitlines()[-1].replace(str(port), "9555"))


def test_a_missing_plot_extra_is_quoted_as_printed(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    with pytest.raises(ValueError) as exc:
        check_output("FILE", "--plot", plot=True)
    _quoted(str(exc.value))


def test_another_models_profile_is_quoted_as_printed(capsys):
    line = _error(["plan", "--log", "sample", "--model", "small", "--tiers", "cpu:1MiB"], capsys)
    _quoted(line.removeprefix("error: ").split(" small (4 layers")[0])
