"""kvoffload: offload paged KV-cache blocks to host DRAM, local disk and shared stores.

Where to start: ``kvoffload run`` on the command line; in Python, the bundled engine
(``from kvoffload.engine import LLM, EngineConfig, SamplingParams``) with an offload config
(``from kvoffload.config import OffloadConfig``); with vLLM, the ``KVOffloadConnector`` plugin
this package registers (docs/vllm.md).
"""

from kvoffload.logs import apply_env_level

__version__ = "0.1.0"

apply_env_level()
