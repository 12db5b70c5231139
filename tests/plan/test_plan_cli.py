"""``kvoffload plan`` end to end: the shipped sample log, a user's JSONL, the sweep's table,
JSON and plot, and the one-line errors of what it cannot plan."""

from __future__ import annotations

import itertools
import json

import pytest

from kvoffload import cli


def plan(*args: str) -> int:
    return cli.main(["plan", *args])


def test_the_sample_log_swept(tmp_path, capsys):
    out, png = tmp_path / "plan.json", tmp_path / "plan.png"
    assert plan("--log", "sample", "--model", "tiny", "--tiers", "cpu:{256,1024,4096,8192}KiB", "--device-blocks",
                "16", "--json", str(out), "--plot", str(png)) == 0
    text = capsys.readouterr().out
    assert "stand-in" in text and "Buy cpu:" in text and "tokens from cpu" in text
    doc = json.loads(out.read_text())
    labels = [r["label"] for r in doc["results"]]
    assert labels == ["cpu:256KiB", "cpu:1MiB", "cpu:4MiB", "cpu:8MiB"]
    served = [r["tiers"][0]["tokens_served"] for r in doc["results"]]
    assert served == sorted(served) and served[-1] > 0  # LRU: a larger tier never serves less
    assert doc["recommended"] in labels and doc["knee"] in labels
    best = max(r["prefill_s_saved"] for r in doc["results"])
    rec = next(r for r in doc["results"] if r["label"] == doc["recommended"])
    assert rec["prefill_s_saved"] >= 0.95 * best
    assert all(r["ttft_p50_s"] <= r["base_ttft_p50_s"] + 1e-12 for r in doc["results"])
    assert png.stat().st_size > 10_000


def test_a_users_token_log_and_a_checkpoint_config(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 4, "num_attention_heads": 8,
                                                   "num_key_value_heads": 2, "hidden_size": 256,
                                                   "intermediate_size": 688, "torch_dtype": "bfloat16"}))
    log = tmp_path / "log.jsonl"
    prefix = list(range(100, 400))
    log.write_text("".join(json.dumps({"prompt_token_ids": prefix + [500 + i] * 20, "timestamp": i * 0.5}) + "\n"
                           for i in range(10)))
    args = ["--log", str(log), "--model", str(model), "--tiers", "cpu:64MiB+disk:1GiB", "--device-blocks", "0"]
    # The shipped profile timed the tiny model: its TTFT would be another model's.
    assert plan(*args) == 2
    err = capsys.readouterr().err
    assert "its engine was timed on tiny (2 layers, 2 KV heads of 16, 0.1M parameters), not on --model" in err
    assert "(4 layers, 2 KV heads of 32, 2.8M parameters)" in err and "`kvoffload bench profile --model" in err
    assert plan(*args, "--scale-profile") == 0
    text = capsys.readouterr().out
    assert "note: TTFT figures are scaled, not measured" in text and "returning TTFT p50 ms (no offload, scaled)" in text
    # 2 (K, V) x 4 layers x 2 heads x 32 dims x 2 bytes = 1 KiB a token, 16 KiB a block.
    assert "16KiB each" in text and "1,024 B of KV per token" in text
    # Nine requests find the 18 shared blocks in the CPU tier (no device cache).
    assert f"{9 * 18 * 16:,} (" in text


@pytest.mark.parametrize(("args", "words"), [
    (["--tiers", "gpu:1GiB"], "--tiers 'gpu:1GiB': medium 'gpu' is not a tier"),
    (["--tiers", "cpu:1GiB+mooncake:1TiB"], "tier 'mooncake': --profile (shipped) has no speeds for it"),
    (["--model", "/no/such/model"], "--model '/no/such/model': no such model"),
    (["--log", "/no/such.jsonl"], "--log /no/such.jsonl: no such file"),
    (["--device-kv", "lots"], "--device-kv 'lots': write a number and a unit"),
    (["--within", "nan"], "--within nan: give a share in [0, 1)"),
    (["--knee-share", "0"], "--knee-share 0.0: give a share in (0, 1]"),
    (["--output-tokens", "100000000000"], "--output-tokens 100000000000: give 1 to 10,000,000"),
    (["--limit", "0"], "--limit 0: give at least 1 request"),
])
def test_what_cannot_be_planned_is_one_line(args, words, capsys):
    base = {"--log": "sample", "--model": "tiny", "--tiers": "cpu:1MiB", **dict(zip(args[::2], args[1::2]))}
    assert plan(*[x for kv in base.items() for x in kv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and words in err and "\n" not in err


def test_a_malformed_log_line_names_it(tmp_path, capsys):
    log = tmp_path / "log.jsonl"
    log.write_text('{"prompt": "hello"}\n{"messages": "hi"}\n')
    assert plan("--log", str(log), "--model", "tiny", "--tiers", "cpu:1MiB") == 2
    assert "line 2: messages must be a non-empty list" in capsys.readouterr().err


def test_bench_serve_writes_the_log_plan_reads(tmp_path, capsys):
    from kvoffload.bench import serve_bench

    log = tmp_path / "served.jsonl"
    assert serve_bench.main(["--engine", "bundled", "--workload", "chat", "--conversations", "3", "--turns", "3",
                             "--context", "64", "--user-tokens", "16", "--max-tokens", "4", "--think", "0",
                             "--configs", "plain,cpu", "--cpu", "16MiB", "--reps", "1", "--write-log", str(log),
                             "--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2",
                             "--vocab", "500"]) == 0
    out = capsys.readouterr().out
    assert f"request log of the first plain run (9 requests): {log}; the model it served: " in out
    model = tmp_path / "served-model"  # kept beside the log: the bench's own model directory is gone
    config = json.loads((model / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_key_value_heads"]) == (2, 64, 2)
    assert f"kvoffload plan --log {log} --model {model}" in out
    assert plan("--log", str(log), "--model", str(model), "--tiers", "cpu:16MiB", "--scale-profile") == 0
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(rows) == 9 and all(r["duration_s"] > 0 and r["max_tokens"] == 4 for r in rows)
    by_session: dict[str, list[list[int]]] = {}
    for r in rows:
        by_session.setdefault(r["session"], []).append(r["prompt_token_ids"])
    for prompts in by_session.values():  # each turn extends the last one and its 4-token answer
        assert [len(p) for p in prompts] == [80, 100, 120]
        assert all(b[: len(a)] == a for a, b in itertools.pairwise(prompts))
    assert plan("--log", str(log), "--model", "tiny", "--tiers", "cpu:16MiB", "--device-blocks", "0",
                "--json", str(tmp_path / "p.json")) == 0
    doc = json.loads((tmp_path / "p.json").read_text())
    # A returning turn finds what the turn before computed, in whole blocks of 16: 80 + 4 - 1
    # tokens (5 blocks) for the second turn, 100 + 4 - 1 (6 blocks) for the third.
    assert doc["results"][0]["tiers"][0]["tokens_served"] == 3 * (80 + 96)


def test_a_petabyte_tier_is_a_tier_that_never_evicts(tmp_path, capsys):
    """Sizes are hostile too: the ledger is never larger than the blocks the log stores, so a
    petabyte plans in moments, and as a tier that holds everything."""
    out = tmp_path / "p.json"
    assert plan("--log", "sample", "--model", "tiny", "--tiers", "cpu:{64MiB,1024TiB}+disk:{1,1024}TiB",
                "--device-blocks", "1000000000000", "--json", str(out)) == 0
    results = json.loads(out.read_text())["results"]
    assert len({(r["device_tokens"], r["prefill_tokens_saved"]) for r in results}) == 1


def test_a_reply_beyond_any_context_is_a_broken_line(tmp_path, capsys):
    log = tmp_path / "log.jsonl"
    log.write_text('{"prompt": "hello", "max_tokens": 1e300}\n')
    assert plan("--log", str(log), "--model", "tiny", "--tiers", "cpu:1MiB") == 2
    assert "line 1: max_tokens must be a finite number in [0, 1e+07], got 1e+300; a longer reply is beyond any model's context" in capsys.readouterr().err


@pytest.mark.parametrize("level", [["--log-level", "info"], ["--log-level=warning"]])
def test_a_global_option_may_come_before_plan_and_sim(level, capsys):
    assert cli.main([*level, "plan", "--log", "sample", "--model", "tiny", "--tiers", "cpu:1MiB",
                     "--device-blocks", "16"]) == 0
    assert "tokens from cpu" in capsys.readouterr().out
    with pytest.raises(SystemExit) as done:  # sim's own parser answers its --help
        cli.main([*level, "sim", "--help"])
    assert done.value.code == 0 and "usage:" in capsys.readouterr().out


def test_a_gzipped_log_plans_as_the_plain_one(tmp_path, capsys):
    import gzip
    from importlib import resources

    sample = (resources.files("kvoffload") / "examples" / "plan" / "sample.jsonl").read_bytes()
    plain, packed = tmp_path / "log.jsonl", tmp_path / "log.jsonl.gz"
    plain.write_bytes(sample)
    packed.write_bytes(gzip.compress(sample))
    docs = []
    for log in (plain, packed):
        out = tmp_path / f"{log.name}.json"
        assert plan("--log", str(log), "--model", "tiny", "--tiers", "cpu:1MiB", "--device-blocks", "16",
                    "--json", str(out)) == 0
        docs.append(json.loads(out.read_text())["results"])
    assert docs[0] == docs[1] and docs[0][0]["tiers"][0]["tokens_served"] > 0


def test_a_profile_of_the_same_model_prices_without_a_note_and_unknown_sizes_cannot_be_scaled(tmp_path, capsys):
    assert plan("--log", "sample", "--model", "tiny", "--tiers", "cpu:1MiB") == 0
    assert "note: TTFT figures are scaled" not in capsys.readouterr().out
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "num_attention_heads": 4,
                                                   "hidden_size": 64}))
    assert plan("--log", "sample", "--model", str(model), "--tiers", "cpu:1MiB", "--scale-profile") == 2
    assert "the parameter count of --model" in capsys.readouterr().err
    own = tmp_path / "p.yaml"
    own.write_text("kvoffload_profile: 1\nengine: {model: mine, step_s: 0.001, token_s: 0.00001}\n"
                   "tiers: {cpu: {load_gb_per_s: 1, store_gb_per_s: 1}}\n")
    assert plan("--log", "sample", "--model", "tiny", "--tiers", "cpu:1MiB", "--profile", str(own)) == 0
    assert "does not say which model its engine was timed on" in capsys.readouterr().out


def test_the_answer_ends_with_the_command_that_checks_it_live(capsys):
    """#84 item 6: the same log, model, device cache and tiers, in bench plan's units; a device
    cache no engine can run says so instead."""
    assert plan("--log", "sample", "--model", "tiny", "--tiers", "cpu:{1,4}MiB", "--device-blocks", "96") == 0
    last = capsys.readouterr().out.rstrip().splitlines()[-1]
    assert last == "  kvoffload bench plan --log sample --tiers 'cpu:{1,4}MiB' --device-blocks 96 --log-limit 24"
    assert plan("--log", "sample", "--model", "tiny", "--tiers", "cpu:1MiB", "--device-blocks", "12",
                "--block-size", "32") == 0  # 12 blocks of 32 tokens: 24 of the bundled engine's 16
    last = capsys.readouterr().out.rstrip().splitlines()[-1]
    assert last.startswith("note: a live engine needs at least 86 device blocks of 16 tokens")
    assert "--device-blocks 43 or more" in last  # in plan's own blocks of 32 tokens
