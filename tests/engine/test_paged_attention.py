import pytest
import torch
import torch.nn.functional as F

from kvoffload.engine.paged_attention import AttentionMetadata, paged_attention, write_kv


def dense_reference(q, k, v, scale):
    """Causal attention of the last q.shape[0] positions over full k/v (GQA by repetition)."""
    n, heads, _ = q.shape
    seq = k.shape[0]
    groups = heads // k.shape[1]
    k = k.repeat_interleave(groups, 1)
    v = v.repeat_interleave(groups, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    mask = torch.arange(seq)[None, :] > torch.arange(seq - n, seq)[:, None]
    scores = scores.masked_fill(mask, float("-inf"))
    return torch.einsum("hqk,khd->qhd", F.softmax(scores, -1), v)


def test_paged_attention_matches_dense_for_random_block_tables():
    gen = torch.Generator().manual_seed(0)
    bs, nblocks, kvh, heads, d = 4, 32, 2, 4, 8
    cache = torch.zeros(2, nblocks, bs, kvh, d)
    perm = torch.randperm(nblocks - 1, generator=gen) + 1  # random physical blocks, 0 unused
    specs = [(13, 5), (7, 7), (20, 1)]  # (context length after step, new tokens)
    tables, offset = [], 0
    full_k, full_v, slots, qs = [], [], [], []
    for seq, n in specs:
        nb = -(-seq // bs)
        table = perm[offset: offset + nb]
        offset += nb
        tables.append(table)
        k = torch.randn(seq, kvh, d, generator=gen)
        v = torch.randn(seq, kvh, d, generator=gen)
        # History tokens written directly; this step's tokens go through write_kv below.
        for p in range(seq - n):
            cache[0, table[p // bs], p % bs] = k[p]
            cache[1, table[p // bs], p % bs] = v[p]
        full_k.append(k)
        full_v.append(v)
        slots += [int(table[p // bs]) * bs + p % bs for p in range(seq - n, seq)]
        qs.append(torch.randn(n, heads, d, generator=gen))
    new_k = torch.cat([k[seq - n:] for k, (seq, n) in zip(full_k, specs)])
    new_v = torch.cat([v[seq - n:] for v, (seq, n) in zip(full_v, specs)])
    slot_mapping = torch.tensor(slots + [-1])  # one padding slot: skipped
    write_kv(cache, torch.cat([new_k, torch.zeros(1, kvh, d)]), torch.cat([new_v, torch.zeros(1, kvh, d)]), slot_mapping)
    width = max(len(t) for t in tables)
    block_tables = torch.zeros(len(tables), width, dtype=torch.int64)
    for i, t in enumerate(tables):
        block_tables[i, : len(t)] = t
    qsl = [0]
    for _, n in specs:
        qsl.append(qsl[-1] + n)
    meta = AttentionMetadata(slot_mapping, qsl, [s for s, _ in specs], block_tables, bs)
    out = paged_attention(torch.cat(qs), cache, meta, scale=d**-0.5)
    for i, (seq, n) in enumerate(specs):
        ref = dense_reference(qs[i], full_k[i], full_v[i], d**-0.5)
        torch.testing.assert_close(out[qsl[i]: qsl[i + 1]], ref, rtol=1e-5, atol=1e-5)
    assert cache[:, 0].abs().sum() == 0  # the padding slot wrote nothing into block 0


def test_grouped_query_heads_in_place_equal_repeated_heads_bit_for_bit(monkeypatch):
    """torch >= 2.5 attends GQA heads in place; the result must be the repeated-heads one exactly
    (greedy generations may not depend on the torch version), windowed or not."""
    from kvoffload.engine import paged_attention as pa

    if not pa._SDPA_GQA:
        pytest.skip(f"torch {torch.__version__} has no enable_gqa: only the repeated path runs")
    gen = torch.Generator().manual_seed(1)
    bs, kvh, heads, d = 16, 4, 8, 64
    cache = torch.randn(2, 40, bs, kvh, d, generator=gen)
    tables = torch.stack([torch.randperm(39, generator=gen)[:20] + 1 for _ in range(3)])
    specs = [(300, 300), (301, 1), (150, 7)]  # a prefill, a decode, a turn's suffix
    qsl = [0]
    for _, n in specs:
        qsl.append(qsl[-1] + n)
    meta = AttentionMetadata(torch.full((qsl[-1],), -1), qsl, [s for s, _ in specs], tables, bs)
    q = torch.randn(qsl[-1], heads, d, generator=gen)
    for window in (None, 64):
        in_place = paged_attention(q, cache, meta, d**-0.5, window=window)
        monkeypatch.setattr(pa, "_SDPA_GQA", False)
        repeated = paged_attention(q, cache, meta, d**-0.5, window=window)
        monkeypatch.setattr(pa, "_SDPA_GQA", True)
        assert torch.equal(in_place, repeated), window
