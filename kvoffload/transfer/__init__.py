"""Worker-side transfers: canonical KV layouts, stream pools, handlers per media pair.

Import the modules themselves (``kvoffload.transfer.handler``, ``.result``, ...): this package
re-exports nothing, so the scheduler half can import ``kvoffload.transfer.result`` without
torch.
"""
