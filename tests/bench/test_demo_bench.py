"""`kvoffload bench demo`: `kvoffload run`'s own settings, and the bar it judges offload by."""

from kvoffload.bench import demo_bench
from kvoffload.bench.measure import Sample
from kvoffload.cli import build_parser


def test_the_bench_runs_what_kvoffload_run_runs():
    args = build_parser().parse_args(["run"])
    assert args.config == demo_bench.OFFLOAD
    for key, value in demo_bench.ENGINE.items():
        assert getattr(args, key) == value, key
    wl = demo_bench.WORKLOAD
    assert (wl.conversations, wl.turns, wl.system_tokens, wl.user_tokens, wl.max_tokens, wl.seed) == (
        args.conversations, args.turns, args.system_tokens, args.user_tokens, args.max_tokens, args.seed)
    assert args.model == "small" and args.threads == 1  # the demo's model, measured first by default


def _samples(p50, p95, tps):
    return {"TTFT p50 (ms)": Sample(p50), "TTFT p95 (ms)": Sample(p95), "tokens/s": Sample(tps)}


def test_the_bar_is_taken_run_by_run_on_the_medians():
    base = _samples((100.0, 100.0, 100.0), (200.0, 200.0, 200.0), (1000.0, 1000.0, 1000.0))
    ok, text = demo_bench.verdict(base, _samples((103.0, 103.0, 90.0), (150.0, 150.0, 150.0), (970.0, 990.0, 900.0)))
    assert ok and text == "TTFT p50 1.03x, TTFT p95 0.75x, tokens/s 0.97x"
    assert not demo_bench.verdict(base, _samples((104.0, 104.0, 104.0), (150.0,) * 3, (1000.0,) * 3))[0]
    assert not demo_bench.verdict(base, _samples((100.0,) * 3, (206.1,) * 3, (1000.0,) * 3))[0]
    assert not demo_bench.verdict(base, _samples((100.0,) * 3, (200.0,) * 3, (969.0,) * 3))[0]


def test_one_rep_on_the_tiny_model_prints_both_columns_and_a_verdict(capsys):
    rc = demo_bench.main(["--models", "tiny", "--reps", "1"])
    out = capsys.readouterr().out
    assert "model=tiny" in out and "offload (auto)" in out
    verdict = [line for line in out.splitlines() if line.startswith("tiny: offload ")]
    assert len(verdict) == 1 and "outputs identical: yes" in verdict[0]
    assert rc == (0 if " meets the bar" in verdict[0] else 1)
