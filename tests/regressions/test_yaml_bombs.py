"""A tiers config or profile of nested YAML aliases (the "billion laughs"): a few hundred bytes
that stand for billions of values. Every place such a value can go ends in one short error, fast
(it used to print an 8-million-character "one-line" error at six levels and exhaust memory at nine)."""

from __future__ import annotations

import time

import pytest

from kvoffload import cli
from kvoffload.errors import ConfigError, describe_value
from kvoffload.yaml_input import MAX_VALUES, load_yaml


def bomb(levels: int) -> str:
    """Anchors a0..a{levels}, each a list of nine of the one before."""
    lines = ['a0: &a0 ["lol"]']
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]")
    return "\n".join(lines) + "\n"


def inline_bomb(levels: int) -> str:
    """The same as one flow list, usable as any key's value: its last item is the deepest level."""
    items = ['&a0 ["lol"]'] + [f"&a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels + 1)]
    return f"[{', '.join(items)}]"


def config_with(levels: int, where: str) -> str:
    head = ""
    top = inline_bomb(levels)
    body = {
        "name": f"tiers:\n  - {{name: {top}, medium: cpu, capacity: 1MiB}}\n",
        "backend": f"tiers: [{{name: cpu, medium: cpu, capacity: 1MiB}}]\ntransfer: {{backend: {top}}}\n",
        "spec_name": f"tiers: [{{name: cpu, medium: cpu, capacity: 1MiB}}]\nspec_name: {top}\n",
        "tenant_keys": f"tiers: [{{name: cpu, medium: cpu, capacity: 1MiB}}]\nhints: {{tenant_keys: {top}}}\n",
        "load_mode": f"tiers: [{{name: cpu, medium: cpu, capacity: 1MiB}}]\nload_mode: {top}\n",
    }[where]
    return head + body


@pytest.mark.parametrize("levels", [4, 6, 9])
@pytest.mark.parametrize("where", ["name", "backend", "spec_name", "tenant_keys", "load_mode"])
def test_config_check_answers_a_bomb_in_one_short_line(tmp_path, capsys, levels, where):
    path = tmp_path / "tiers.yaml"
    path.write_text(config_with(levels, where))
    started = time.monotonic()
    assert cli.main(["config", "check", str(path)]) == 2
    elapsed = time.monotonic() - started
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and len(err) < 1000, err[:2000]
    assert elapsed < 2.0


def test_a_bomb_is_refused_for_what_it_stands_for_not_its_size():
    text = bomb(6)
    assert len(text) < 400
    with pytest.raises(ConfigError, match=f"stands for more than {MAX_VALUES:,} values"):
        load_yaml(text, "tiers.yaml")
    assert load_yaml(bomb(4), "tiers.yaml")["a4"][0][0][0][0] == ["lol"]  # 9^4 values: fine


def test_a_recursive_alias_loads_without_looping():
    doc = load_yaml("a: &a [1, *a]\n", "x.yaml")
    assert doc["a"][1] is doc["a"]
    assert describe_value(doc["a"]) == "a list of 2 items"


def test_a_profile_whose_machine_is_a_bomb_is_one_line(tmp_path, capsys):
    prof = tmp_path / "p.yaml"
    prof.write_text("x:\n" + "".join("  " + line + "\n" for line in bomb(9).splitlines())
                    + "kvoffload_profile: 1\nmachine: *a9\nengine: {step_s: 0.001, token_s: 0.0001}\n")
    started = time.monotonic()
    assert cli.main(["plan", "--log", "sample", "--model", "tiny", "--tiers", "cpu:1MiB", "--profile", str(prof)]) == 2
    err = capsys.readouterr().err.strip()
    assert "stands for more than" in err and len(err) < 1000 and time.monotonic() - started < 2.0
    prof.write_text("kvoffload_profile: 1\nmachine: [a, b]\nengine: {step_s: 0.001, token_s: 0.0001}\n")
    assert cli.main(["plan", "--log", "sample", "--model", "tiny", "--tiers", "cpu:1MiB", "--profile", str(prof)]) == 2
    assert "machine = ['a', 'b']: give a short text" in capsys.readouterr().err


@pytest.mark.parametrize("value", [10**500, "x" * 10**6, list(range(10**6)), {i: i for i in range(10**5)}])
def test_describe_value_is_short_whatever_the_value(value):
    started = time.monotonic()
    text = describe_value(value)
    assert len(text) < 120 and time.monotonic() - started < 0.5
