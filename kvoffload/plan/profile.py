"""What a plan's clock is made of: the engine's prefill speed and each tier's copy speeds, as
measured on a machine (``kvoffload bench profile`` writes one) or edited by hand (YAML).

A load of ``n`` bytes from a tier takes ``load_latency_s + n / (load_gb_per_s * 1e9)``; a
prefill of ``n`` new tokens after ``c`` cached ones takes ``ceil(n / max_batched_tokens)`` steps
of ``step_s`` plus ``n * token_s + n * (c + n / 2) * attention_s`` (attention reads every
earlier token); each request decoding in a step adds ``decode_s`` and ``decode_context_s`` per
token of its context; a step computing nothing while a load is on its way takes ``idle_step_s``,
and each load adds ``load_step_s`` to the step sending it and to the one taking it back; a
server's front end adds ``request_s`` to every time to first token.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from numpy.typing import ArrayLike

from kvoffload.errors import ConfigError, describe_value
from kvoffload.yaml_input import load_yaml

VERSION = 1
#: An idle step shorter than this is no measurement (the replay would count ~1e27 of them):
#: refused in a profile, read as 0 from a server.
MIN_IDLE_STEP_S = 1e-6
#: The largest step budget taken, in tokens; a token faster than ``MIN_TOKEN_S`` is no engine's.
MAX_BATCHED_TOKENS = 1 << 24
MIN_TOKEN_S = 1e-12


class ProfileError(ValueError):
    """A profile that cannot price a plan (the key path and the fix)."""


@dataclass(frozen=True, slots=True)
class TierSpeed:
    load_gb_per_s: float
    store_gb_per_s: float
    load_latency_s: float = 0.0
    store_latency_s: float = 0.0

    # Each price takes one job's figures or an array of them (numpy): one formula for both.
    def load_s(self, nbytes: ArrayLike) -> np.ndarray:
        n = np.asarray(nbytes, dtype=float)
        return np.where(n > 0, self.load_latency_s + n / (self.load_gb_per_s * 1e9), 0.0)

    def store_s(self, nbytes: ArrayLike) -> np.ndarray:
        n = np.asarray(nbytes, dtype=float)
        return np.where(n > 0, self.store_latency_s + n / (self.store_gb_per_s * 1e9), 0.0)


@dataclass(frozen=True, slots=True)
class EngineSpeed:
    model: str
    step_s: float
    token_s: float
    attention_s: float = 0.0
    max_batched_tokens: int = 2048
    #: What each decoding request adds to a step, and each token of its context (attention).
    decode_s: float = 0.0
    decode_context_s: float = 0.0
    #: The model these terms were timed on (``KVShape.signature``, its parameter count): a
    #: plan for another model refuses them, or scales them when asked (``scaled``).
    shape: str = ""
    params: int = 0
    #: A step that computes nothing while a load is on its way (scheduling, sending the load
    #: off, asking whether it landed): the engine learns a load landed only at a step's end.
    idle_step_s: float = 0.0
    #: What one load adds to the step that sends it off and to the one that takes it back (the
    #: connector's lookup and pins, the copy's submission, its report).
    load_step_s: float = 0.0
    #: What a request's way into the engine and its first token's way out add to its time to
    #: first token (a server's HTTP front end and its messages to the engine core).
    request_s: float = 0.0

    def scaled(self, model: str, shape: str, params: int) -> EngineSpeed:
        """These terms guessed for a model of ``params`` weights: every per-token and attention
        term by the ratio of weights (FLOPs per token), the fixed cost of a step as it is. A
        guess, not a measurement: the plan marks what it prices with it."""
        w = params / self.params
        return replace(self, model=model, shape=shape, params=params, token_s=self.token_s * w,
                       decode_s=self.decode_s * w, attention_s=self.attention_s * w,
                       decode_context_s=self.decode_context_s * w)

    def prefill_s(self, new: ArrayLike, cached: ArrayLike = 0) -> np.ndarray:
        """A prefill alone (one request, or an array of them, each by itself)."""
        n, c = np.asarray(new, dtype=float), np.asarray(cached, dtype=float)
        steps = np.ceil(n / self.max_batched_tokens)
        alone = steps * self.step_s + n * self.token_s + n * (c + n / 2) * self.attention_s
        return np.where(n > 0, alone, self.step_s)  # one token is always computed: the step that samples


@dataclass(frozen=True, slots=True)
class Profile:
    engine: EngineSpeed
    tiers: dict[str, TierSpeed] = field(default_factory=dict)
    machine: str = ""
    #: Where each figure came from ("engine", "tiers.cpu", ...), where the writer said.
    sources: dict[str, str] = field(default_factory=dict)

    def tier(self, medium: str, source: str = "the profile") -> TierSpeed:
        speed = self.tiers.get(medium)
        if speed is None:
            have = ", ".join(sorted(self.tiers)) or "none"
            raise ProfileError(f"tier {describe_value(medium)}: {source} has no speeds for it (it has {have}); measure it with "
                               f"`kvoffload bench profile --tiers cpu,{medium}` or add tiers.{medium} to the YAML")
        return speed

    def to_yaml(self) -> str:
        doc = {"kvoffload_profile": VERSION, "machine": self.machine, "engine": asdict(self.engine),
               "tiers": {m: asdict(s) for m, s in self.tiers.items()}}
        if self.sources:
            doc["sources"] = dict(self.sources)
        return yaml.safe_dump(doc, sort_keys=False)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_yaml())


def _positive(d: dict[str, Any], key: str, where: str, zero_ok: bool = False) -> float:
    v = d.get(key)
    # An int of hundreds of digits is checked as an int: float() of it would overflow.
    number = v if isinstance(v, int | float) and not isinstance(v, bool) else math.nan
    if not (0 <= number <= 1e12) or (number == 0 and not zero_ok):  # NaN fails too
        bound = ">= 0" if zero_ok else "> 0"
        raise ProfileError(f"{where}.{key} = {describe_value(v)}: give a finite number {bound}")
    return float(number)


def _text(d: dict[str, Any], key: str, where: str) -> str:
    """A label (the machine, the model): a short string, or absent."""
    v = d.get(key, "")
    if isinstance(v, int | float) and not isinstance(v, bool) and describe_value(v) == repr(v):
        v = str(v)  # a number as a label: a short one only
    if not isinstance(v, str) or len(v) > 500:
        raise ProfileError(f"{where}.{key} = {describe_value(v)}: give a short text, e.g. the machine's name")
    return str(v)


def parse_profile(doc: Any, source: str = "profile") -> Profile:
    if not isinstance(doc, dict) or doc.get("kvoffload_profile") != VERSION:
        raise ProfileError(f"{source}: not a kvoffload profile (kvoffload_profile: {VERSION} missing); write one with "
                           "`kvoffload bench profile --out FILE`")
    eng = doc.get("engine")
    if not isinstance(eng, dict):
        raise ProfileError(f"{source}: engine: give step_s, token_s (and attention_s, max_batched_tokens)")
    mbt = eng.get("max_batched_tokens", 2048)
    if type(mbt) is not int or not 1 <= mbt <= MAX_BATCHED_TOKENS:
        raise ProfileError(f"{source}: engine.max_batched_tokens = {describe_value(mbt)}: give an integer from 1 "
                           f"to {MAX_BATCHED_TOKENS}, the engine's tokens a step (vLLM's max_num_batched_tokens)")
    optional = {k: _positive(eng, k, "engine", True) if k in eng else 0.0
                for k in ("attention_s", "decode_s", "decode_context_s", "idle_step_s", "load_step_s", "request_s")}
    if 0 < optional["idle_step_s"] < MIN_IDLE_STEP_S:
        raise ProfileError(f"{source}: engine.idle_step_s = {describe_value(eng['idle_step_s'])}: an idle step "
                           f"below {MIN_IDLE_STEP_S:g} s is not a measurement; give 0 or the seconds measured")
    if _positive(eng, "token_s", "engine") < MIN_TOKEN_S:
        raise ProfileError(f"{source}: engine.token_s = {describe_value(eng['token_s'])}: faster than "
                           f"{MIN_TOKEN_S:g} s a token is no engine's; give the seconds measured")
    params = eng.get("params", 0)
    if type(params) is not int or not 0 <= params <= 10**15:
        raise ProfileError(f"{source}: engine.params = {describe_value(params)}: give the timed model's parameter "
                           "count (an integer), or leave it out")
    engine = EngineSpeed(_text(eng, "model", f"{source}: engine"), _positive(eng, "step_s", "engine", True),
                         _positive(eng, "token_s", "engine"), optional["attention_s"], mbt, optional["decode_s"],
                         optional["decode_context_s"], _text(eng, "shape", f"{source}: engine"), params,
                         optional["idle_step_s"], optional["load_step_s"], optional["request_s"])
    tiers_doc = doc.get("tiers") or {}
    if not isinstance(tiers_doc, dict):
        raise ProfileError(f"{source}: tiers: a mapping of medium -> speeds")
    tiers = {}
    for medium, t in tiers_doc.items():
        where = f"tiers.{medium}"
        if not isinstance(t, dict):
            raise ProfileError(f"{source}: {where}: give load_gb_per_s, store_gb_per_s and the latencies")
        tiers[str(medium)] = TierSpeed(_positive(t, "load_gb_per_s", where), _positive(t, "store_gb_per_s", where),
                                       _positive(t, "load_latency_s", where, True) if "load_latency_s" in t else 0.0,
                                       _positive(t, "store_latency_s", where, True) if "store_latency_s" in t else 0.0)
    sources = doc.get("sources") or {}
    if not isinstance(sources, dict) or len(sources) > 64:
        raise ProfileError(f"{source}: sources: a mapping of figure -> where it came from (short texts)")
    return Profile(engine, tiers, _text(doc, "machine", source),
                   {str(k)[:100]: _text(sources, k, f"{source}: sources") for k in sources})


def load_profile(path: str | Path | None) -> Profile:
    """A profile file; None: the one shipped with kvoffload (this project's CI machine)."""
    if path is None:
        from importlib import resources

        path = Path(str(resources.files("kvoffload") / "examples" / "plan" / "profile.yaml"))
    p = Path(path)
    if not p.is_file():
        raise ProfileError(f"--profile {path}: no such file; write one with `kvoffload bench profile --out {path}`")
    try:
        doc = load_yaml(p.read_text(), f"--profile {path}")
    except (ConfigError, UnicodeDecodeError) as exc:
        raise ProfileError(str(exc) if isinstance(exc, ConfigError) else f"--profile {path}: not UTF-8 text") from None
    return parse_profile(doc, f"--profile {path}")
