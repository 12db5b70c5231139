"""Built-in multi-turn chat workload: a shared system prompt, several conversations, turns.

Each turn's prompt is the system prompt + the whole conversation so far + a new user message,
so every turn re-sends a growing prefix: exactly the traffic prefix caching and offload serve.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from kvoffload.engine import LLM, SamplingParams


@dataclass(frozen=True, slots=True)
class ChatWorkload:
    conversations: int = 8
    turns: int = 3
    system_tokens: int = 256
    user_tokens: int = 48
    max_tokens: int = 16
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("conversations", "turns", "system_tokens", "user_tokens", "max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"workload {name}={getattr(self, name)}: must be >= 1")


def run_chat_workload(llm: LLM, wl: ChatWorkload, on_turn: Callable[[int], None] | None = None) -> list[list[int]]:
    """Run every turn of every conversation (one batch per turn); return all generated tokens."""
    rng = random.Random(wl.seed)
    vocab = min(llm.model_config.vocab_size, 256)
    system = [rng.randrange(vocab) for _ in range(wl.system_tokens)]
    histories = [list(system) for _ in range(wl.conversations)]
    params = SamplingParams(max_tokens=wl.max_tokens, ignore_eos=True)
    generated: list[list[int]] = []
    for turn in range(wl.turns):
        prompts = []
        for hist in histories:
            hist.extend(rng.randrange(vocab) for _ in range(wl.user_tokens))
            prompts.append(list(hist))
        outs = llm.generate(prompts, params)
        for hist, out in zip(histories, outs):
            hist.extend(out.token_ids)
            generated.append(out.token_ids)
        if on_turn is not None:
            on_turn(turn)
    return generated
