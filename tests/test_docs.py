"""The documentation's blocks run: every YAML config goes through `kvoffload config check`,
every `kvoffload ...` command line through the CLI's own argument parsers (a dry run: the
command is parsed, not executed), every `vllm serve` config through the connector's config
check, every Python block compiles, and every extra a `pip install` names exists. The README
stays a page: its two commands first, at most 200 lines."""

from __future__ import annotations

import argparse
import json
import re
import shlex
from importlib.metadata import metadata
from pathlib import Path

import pytest
import yaml

from kvoffload import cli
from kvoffload.config import ConfigError, OffloadConfig
from kvoffload.examples import resolve_config

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
SECRET = "0123456789abcdef0123456789abcdef"


def _blocks(lang: str) -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        text = page.read_text()
        for m in FENCE.finditer(text):
            if m.group(1) == lang:
                line = text[: m.start()].count("\n") + 1
                found.append((f"{page.relative_to(ROOT)}:{line}", m.group(2)))
    return found


def _commands(body: str) -> list[str]:
    """Each shell command of a block, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", body)
    out, pending = [], ""
    for line in joined.splitlines():
        pending += line + "\n"
        try:  # a quoted argument may span lines (a JSON config)
            words = shlex.split(pending, comments=True)
        except ValueError:
            continue
        pending = ""
        if words:
            out.append(shlex.join(words))
    assert not pending, f"unclosed quote in {body!r}"
    return out


def _all_commands() -> list[tuple[str, str]]:
    return [(where, cmd) for lang in ("bash", "sh") for where, body in _blocks(lang) for cmd in _commands(body)]


def test_the_readme_is_a_page_that_opens_with_its_two_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    first = FENCE.search(text)
    assert first is not None and first.group(1) == "bash"
    assert text[: first.start()].strip() == "# kvoffload"
    assert _commands(first.group(2)) == [
        "pip install torch==2.13.0 '&&' pip install -e '.[test]' '&&' kvoffload run",
        "python -m pytest -q",
    ]


def test_the_docs_have_blocks_of_every_kind_the_checks_below_read():
    # A renamed fence (```yml, ```shell) would skip the checks silently: keep them counted.
    assert len(_blocks("yaml")) >= 4
    assert sum(cmd.startswith("kvoffload ") for _, cmd in _all_commands()) >= 10
    assert sum(cmd.startswith("vllm serve ") for _, cmd in _all_commands()) >= 2
    langs = {m.group(1) for page in PAGES for m in FENCE.finditer(page.read_text())}
    assert langs <= {"", "bash", "yaml", "python", "json", "text"}, langs


def _as_config(body: str) -> dict:
    data = yaml.safe_load(body)
    if isinstance(data, list):  # a fragment of `tiers:` (a tier entry shown on its own)
        data = {"tiers": [{"medium": "cpu", "capacity": "64MiB"}, *data]}
    assert isinstance(data, dict)
    return data


def _offline(data: dict, tmp_path: Path) -> dict:
    """The config with what this machine cannot provide swapped for what it can: paths under
    tmp_path, sizes that fit; the keys and their values' kinds stay the documented ones."""
    for i, tier in enumerate(data.get("tiers") or []):
        if tier.get("medium") in ("disk", "fs"):
            if "path" in tier:
                tier["path"] = str(tmp_path / f"t{i}")
            if "paths" in tier:
                tier["paths"] = [str(tmp_path / f"t{i}-{j}") for j in range(len(tier["paths"]))]
            if isinstance(tier.get("capacity"), str) and not tier["capacity"].endswith("%"):
                tier["capacity"] = "64MiB"
        elif tier.get("medium") == "cpu":
            tier["capacity"] = "64MiB"
    return data


@pytest.mark.parametrize("where,body", _blocks("yaml"), ids=[w for w, _ in _blocks("yaml")])
def test_every_yaml_block_passes_config_check(where, body, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KVOFFLOAD_SECRET", SECRET)
    monkeypatch.setenv("KVOFFLOAD_CACHE_DIR", str(tmp_path / "cache"))
    data = _as_config(body)
    if any(t.get("medium") == "zram" for t in data.get("tiers") or []):
        # docs/write-a-tier.md's example, as if installed: its entry point's one line.
        from kvoffload.registry import TIER_KINDS

        monkeypatch.syspath_prepend(str(ROOT / "examples" / "zram_tier"))
        monkeypatch.setitem(TIER_KINDS._targets, "zram", "zram_tier.kind:ZramKind")
    OffloadConfig.from_dict(data)  # the schema as documented, before anything is swapped
    if any(t.get("medium") == "mooncake" for t in data.get("tiers") or []):
        return  # `config check` asks the master; tests/tiers/mooncake checks these against a real one
    path = tmp_path / "doc.yaml"
    path.write_text(yaml.safe_dump(_offline(data, tmp_path)))
    assert cli.main(["config", "check", str(path)]) == 0, (where, capsys.readouterr().err)


class _Parsed(Exception):
    pass


def _dry_run(argv: list[str], monkeypatch) -> argparse.Namespace:
    """Parse argv as `kvoffload` would, down to the benchmark's or simulator's own parser, and
    stop there."""
    real = argparse.ArgumentParser.parse_args

    def parse_only(self, args=None, namespace=None):
        ns = real(self, args, namespace)
        if self.prog == "kvoffload" and getattr(ns, "command", None) == "bench":
            return ns  # on to the benchmark's own parser
        raise _Parsed(ns)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_only)
    with pytest.raises(_Parsed) as parsed:
        cli.main(argv)
    return parsed.value.args[0]


@pytest.mark.parametrize("where,cmd", [c for c in _all_commands() if c[1].startswith("kvoffload ")],
                         ids=[w for w, c in _all_commands() if c.startswith("kvoffload ")])
def test_every_kvoffload_command_parses(where, cmd, monkeypatch):
    ns = _dry_run(shlex.split(cmd)[1:], monkeypatch)
    assert ns is not None, where


def test_the_dry_run_catches_a_flag_that_does_not_exist(monkeypatch):
    with pytest.raises(SystemExit):
        _dry_run(["bench", "serve", "--workload", "chat", "--no-such-flag"], monkeypatch)
    with pytest.raises(SystemExit):
        _dry_run(["run", "--confg", "cpu"], monkeypatch)


def _vllm_configs() -> list[tuple[str, dict]]:
    out = []
    for where, cmd in _all_commands():
        words = shlex.split(cmd)
        if words[:2] == ["vllm", "serve"]:
            out.append((where, json.loads(words[words.index("--kv-transfer-config") + 1])))
    return out


@pytest.mark.parametrize("where,ktc", _vllm_configs(), ids=[w for w, _ in _vllm_configs()])
def test_every_vllm_serve_config_resolves(where, ktc, monkeypatch, tmp_path):
    monkeypatch.setenv("KVOFFLOAD_CACHE_DIR", str(tmp_path))
    assert ktc["kv_connector"] in ("KVOffloadConnector", "OffloadingConnector")
    assert ktc["kv_role"] == "kv_both"
    extra = ktc["kv_connector_extra_config"]
    if ktc["kv_connector"] == "OffloadingConnector":
        assert extra["spec_name"] == "KVOffloadSpec"
    if "config_file" in extra:
        assert cli.main(["config", "check", str(resolve_config(extra["config_file"])),
                         "--block-size", "128"]) == 0, where
    else:
        OffloadConfig.from_dict(_offline(extra["config"], tmp_path))


@pytest.mark.parametrize("where,body", _blocks("python"), ids=[w for w, _ in _blocks("python")])
def test_every_python_block_compiles(where, body):
    compile(body, where, "exec")


def test_every_extra_a_pip_command_names_exists():
    extras = set(metadata("kvoffload").get_all("Provides-Extra") or [])
    named: set[str] = set()
    for _, cmd in _all_commands():
        for m in re.finditer(r"(?:kvoffload|\.)\[([\w,-]+)\]", cmd):
            named.update(m.group(1).split(","))
    assert named and named <= extras, named - extras


CPU = {"medium": "cpu", "capacity": "1MiB"}
SECTIONS = {
    "": {"zz": 1},
    "transfer": {"tiers": [CPU], "transfer": {"zz": 1}},
    "metrics": {"tiers": [CPU], "metrics": {"zz": 1}},
    "hints": {"tiers": [CPU], "hints": {"zz": 1}},
    "auth": {"tiers": [CPU], "auth": {"zz": 1}},
    "cpu tier": {"tiers": [{**CPU, "zz": 1}]},
    "disk tier": {"tiers": [CPU, {"medium": "disk", "capacity": "1MiB", "zz": 1}]},
    "fs tier": {"tiers": [CPU, {"medium": "fs", "path": "/nonexistent", "zz": 1}]},
    "mooncake tier": {"tiers": [CPU, {"medium": "mooncake", "master": "127.0.0.1:1", "zz": 1}]},
}


@pytest.mark.parametrize("section", list(SECTIONS))
def test_every_config_key_is_documented_with_its_value(section):
    """The configuration pages show every key the config accepts as a YAML key (with a value
    and its default or meaning beside it); the keys come from the config's own error for an
    unknown one, so a key added to the code and not to the docs fails here."""
    with pytest.raises(ConfigError, match="unknown key") as err:
        OffloadConfig.from_dict(SECTIONS[section])
    keys = str(err.value).split("allowed keys here: ")[1].split(", ")
    shown = "\n".join(body for _, body in _blocks("yaml"))
    missing = [k for k in keys if not re.search(rf"^\s*(- )?{k}:", shown, re.M) and f"{k}:" not in shown]
    assert not missing, f"{section or 'top level'}: {missing} not in any YAML block of the docs"


def test_the_quickstart_python_runs_and_prints_what_its_comment_says(capsys):
    """The quickstart's one Python block is what a newcomer pastes first: it runs as written."""
    quickstart = [body for where, body in _blocks("python") if where.startswith("docs/quickstart.md")]
    assert len(quickstart) == 1
    exec(compile(quickstart[0], "quickstart", "exec"), {})
    assert capsys.readouterr().out.strip().endswith("{'device': 0, 'cpu': 192, 'disk': 0}")
