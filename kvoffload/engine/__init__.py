"""The bundled paged-KV engine core: scheduler, block pool, prefix cache, paged attention."""

from kvoffload.engine.config import EngineConfig
from kvoffload.engine.llm import LLM
from kvoffload.engine.outputs import RequestOutput
from kvoffload.engine.sampling_params import SamplingParams
from kvoffload.engine.stats import EngineStats

__all__ = ["LLM", "EngineConfig", "EngineStats", "RequestOutput", "SamplingParams"]
