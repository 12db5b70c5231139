"""Canonical views: row i of the views, concatenated, is exactly block i's K and V bytes."""

import pytest
import torch

from kvoffload.transfer.layout import LayoutError, canonicalize

N, BS, H, D, L = 7, 4, 2, 8, 3


def block_bytes_reference(layer_tensors, kv_first: bool, i: int) -> bytes:
    """Block i's bytes read the slow, obvious way from each layout."""
    out = b""
    for t in layer_tensors:
        if kv_first:
            out += t[0, i].numpy().tobytes() + t[1, i].numpy().tobytes()
        else:
            out += t[i].numpy().tobytes()
    return out


def patterned(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g)


def canonical_block(c, i) -> bytes:
    return b"".join(v[i].numpy().tobytes() for v in c.views)


@pytest.mark.parametrize("kv_first", [True, False], ids=["(2,N,...)", "(N,2,...)"])
def test_per_layer_layouts(kv_first):
    shape = (2, N, BS, H, D) if kv_first else (N, 2, BS, H, D)
    layers = [patterned(shape, s) for s in range(L)]
    c = canonicalize({f"l{i}": t for i, t in enumerate(layers)}, N)
    assert c.page_bytes == L * 2 * BS * H * D * 4
    for i in range(N):
        assert canonical_block(c, i) == block_bytes_reference(layers, kv_first, i)
    # Writing through a view writes the engine's tensor (views, not copies).
    c.views[0][3].fill_(0)
    first = layers[0][0, 3] if kv_first else layers[0][3]
    assert first.abs().sum() == 0


def test_cross_layer_blocks_first():
    t = patterned((N, L, 2, BS, H, D), 1)
    c = canonicalize(t, N)
    assert len(c.views) == 1
    for i in range(N):
        assert canonical_block(c, i) == t[i].numpy().tobytes()


def test_cross_layer_layers_first():
    t = patterned((L, 2, N, BS, H, D), 2)
    c = canonicalize(t, N)
    assert len(c.views) == L * 2
    for i in range(N):
        assert canonical_block(c, i) == b"".join(t[l, kv, i].numpy().tobytes() for l in range(L) for kv in range(2))


def test_num_blocks_equal_to_block_size_picks_outer_dim():
    t = patterned((2, 4, 4, H, D), 3)  # num_blocks == block_size == 4
    c = canonicalize([t], 4)
    for i in range(4):
        assert canonical_block(c, i) == t[0, i].numpy().tobytes() + t[1, i].numpy().tobytes()


def test_bfloat16_and_strided_rows():
    big = torch.zeros(N, 2, BS, H, D * 2, dtype=torch.bfloat16)
    t = big[..., :D]  # inner dims not contiguous → no valid block dim
    with pytest.raises(LayoutError, match="no dim of size num_blocks"):
        canonicalize([t], N)
    ok = torch.ones(N, 2, BS, H, D, dtype=torch.bfloat16)
    assert canonicalize([ok], N).page_bytes == 2 * BS * H * D * 2


def test_errors():
    with pytest.raises(LayoutError, match="no dim of size num_blocks=5"):
        canonicalize([torch.zeros(2, 7, 4)], 5)
    with pytest.raises(LayoutError, match="num_blocks=2"):
        canonicalize([torch.zeros(2, 2, 4)], 2)
    with pytest.raises(LayoutError, match="no KV-cache tensors"):
        canonicalize([], 4)


def test_a_tensor_shared_by_layers_of_several_groups_is_one_view():
    """vLLM's hybrid allocator registers a shared KV tensor under every layer using it; it is
    copied once (two views of it would move its bytes twice and double the block size)."""
    import torch

    from kvoffload.transfer.layout import canonicalize

    shared = torch.zeros(10, 2, 4, 8)  # (blocks, K/V, block size, head dim)
    own = torch.zeros(10, 2, 4, 8)
    kv = canonicalize({"layers.0": shared, "layers.1": shared.view(10, 2, 4, 8), "layers.2": own}, 10)
    assert len(kv.views) == 2 and kv.page_bytes == 2 * 2 * 4 * 8 * 4
