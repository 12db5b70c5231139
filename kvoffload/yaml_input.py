"""YAML written by someone else (a tiers config, a speeds profile), loaded in bounded time and memory.

PyYAML's ``safe_load`` shares an aliased node instead of copying it, so a 500-byte document of
nested aliases (the "billion laughs") loads small but stands for billions of values: whatever
walks or prints it (a validator, an error message) then runs for minutes and exhausts memory.
So the document is composed first, the values it stands for are counted over the node graph
(each node once, its count reused wherever it is aliased), and a document standing for more
than ``MAX_VALUES`` is refused before anything is built from it.
"""

from __future__ import annotations

from typing import Any

import yaml

from kvoffload.errors import ConfigError

#: A config or profile holds tens of values; a few hundred tiers or policies at the very most.
MAX_VALUES = 100_000


def _expanded(node: yaml.Node, memo: dict[int, int]) -> int:
    """How many values ``node`` stands for once every alias is copied out (memoised: aliases
    make the graph a DAG, and each distinct node is counted once)."""
    key = id(node)
    if key in memo:
        return memo[key]
    memo[key] = 1  # a node that contains itself (a recursive alias) counts once
    total = 1
    if isinstance(node, yaml.SequenceNode):
        for child in node.value:
            total += _expanded(child, memo)
            if total > MAX_VALUES:
                break
    elif isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            total += _expanded(k, memo) + _expanded(v, memo)
            if total > MAX_VALUES:
                break
    memo[key] = total
    return total


def load_yaml(text: str, source: str) -> Any:
    """The document in ``text`` (None when empty); a ConfigError naming ``source`` for text that
    is not YAML, nests past Python's recursion limit, or expands past ``MAX_VALUES`` values."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        n = _expanded(node, {})
        if n > MAX_VALUES:
            raise ConfigError(f"{source}: the YAML stands for more than {MAX_VALUES:,} values once its aliases (&, *) "
                              "are expanded; write the values out, without aliases nested in aliases")
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML ({' '.join(str(exc).split())[:300]})") from None
    except RecursionError:
        raise ConfigError(f"{source}: the YAML is nested too deeply to read; a config is a few levels deep") from None
    finally:
        loader.dispose()
