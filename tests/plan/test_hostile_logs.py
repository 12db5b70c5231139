"""``kvoffload plan`` (and the readers ``bench serve --workload log`` shares) against logs,
configs and profiles written by an adversary: every input ends in a plan or in one ``error:``
line naming the line, the field and the fix, in bounded time and memory."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import signal
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvoffload import cli
from kvoffload.log_lines import RequestLogError, read_lines
from kvoffload.plan.log_reader import read_log
from kvoffload.plan.planner import make_plan
from kvoffload.plan.profile import load_profile
from kvoffload.plan.tier_spec import parse_chain

BIG = int("1" + "0" * 400)  # 401 digits
DEEP = "[" * 100_000


@contextlib.contextmanager
def within(seconds: float) -> Iterator[None]:
    """Fails the test (instead of hanging it) when the body runs past ``seconds``."""
    def expire(*_: object) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def plan_error(capsys: pytest.CaptureFixture[str], *args: str, seconds: float = 20.0) -> str:
    """Runs ``kvoffload plan`` expecting one error line; returns it."""
    base = {"--log": "sample", "--model": "tiny", "--tiers": "cpu:1MiB", **dict(zip(args[::2], args[1::2]))}
    with within(seconds):
        code = cli.main(["plan", *[x for kv in base.items() for x in kv]])
    captured = capsys.readouterr()
    assert code == 2, captured.out
    err = captured.err.strip()
    assert err.startswith("error: ") and "\n" not in err and len(err) < 1000, err
    return err


def write(tmp_path: Path, name: str, text: str | bytes) -> str:
    p = tmp_path / name
    if isinstance(text, str):
        text = text.encode()
    p.write_bytes(gzip.compress(text) if name.endswith(".gz") else text)
    return str(p)


def weka(tmp_path: Path, members: dict[str, bytes]) -> str:
    p = tmp_path / "trace.tar.gz"
    with tarfile.open(p, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return str(p)


# ---- item 1: a NaN time ends the plan at once instead of looping forever --------------------------

@pytest.mark.parametrize("line", ['{"hash_ids": [1, 2, 4], "timestamp": NaN}',
                                  '{"hash_ids": [1, 2, 4], "timestamp": "nan"}',
                                  '{"hash_ids": [1, 2, 4], "timestamp": Infinity}',
                                  '{"hash_ids": [1, 2, 4], "timestamp": -5e305}',
                                  '{"hash_ids": [1, 2, 4], "timestamp": 5e305}'])
def test_a_mooncake_time_that_is_no_time_is_one_line(tmp_path, capsys, line):
    log = write(tmp_path, "m.jsonl", '{"hash_ids": [1, 2], "timestamp": 0}\n' + line + "\n")
    assert "line 2: timestamp (ms) must be a finite number in [0, 1e+14]" in plan_error(capsys, "--log", log)


def test_a_weka_time_of_nan_is_one_line(tmp_path, capsys):
    trace = b'{"id": "a", "requests": [{"t": 0, "hash_ids": [1]}, {"t": NaN, "hash_ids": [1, 2]}]}'
    err = plan_error(capsys, "--log", weka(tmp_path, {"trace_0001.json": trace}))
    assert "trace_0001.json: t must be a finite number" in err and "nan" in err


# ---- item 2: what used to be a traceback ---------------------------------------------------------

@pytest.mark.parametrize(("record", "field"), [
    ({"prompt": "hi", "timestamp": BIG}, "timestamp"),
    ({"prompt": "hi", "max_tokens": BIG}, "max_tokens"),
    ({"prompt": "hi", "duration_s": BIG}, "duration_s"),
    ({"body": {"prompt": "hi", "max_tokens": BIG}}, "max_tokens"),
])
def test_a_401_digit_number_is_one_line(tmp_path, capsys, record, field):
    log = write(tmp_path, "log.jsonl", '{"prompt": "fine"}\n' + json.dumps(record) + "\n")
    err = plan_error(capsys, "--log", log)
    assert f"line 2: {field} must be a finite number" in err and "an integer of about 401 digits" in err


@pytest.mark.parametrize("length", ["1e400", "1e19", str(BIG)])
def test_a_mooncake_input_length_past_any_context_is_one_line(tmp_path, capsys, length):
    log = write(tmp_path, "m.jsonl", '{"hash_ids": [1, 2], "timestamp": 0, "input_length": ' + length + "}\n")
    assert "line 1: input_length must be a finite number in [0, 1e+08]" in plan_error(capsys, "--log", log)


@pytest.mark.parametrize("flag", ["--tiers", "--device-kv"])
def test_a_309_digit_size_is_one_line(capsys, flag):
    size = "1" + "0" * 308 + "GiB"
    err = plan_error(capsys, flag, f"cpu:{size}" if flag == "--tiers" else size)
    assert "too large; at most 1 EiB" in err


@pytest.mark.parametrize("size", ["1_0MiB", "\uff11\uff10MiB", "\u0661\u0660MiB"])
def test_a_size_is_written_in_ascii_digits(capsys, size):
    assert "write a number and a unit" in plan_error(capsys, "--tiers", f"cpu:{size}")


@pytest.mark.parametrize("name", ["log.jsonl", "log.jsonl.gz"])
def test_deep_nesting_in_a_log_line_is_one_line(tmp_path, capsys, name):
    log = write(tmp_path, name, '{"prompt": "fine"}\n' + DEEP + "\n")
    assert "line 2: JSON nested too deeply" in plan_error(capsys, "--log", log)


def test_deep_nesting_in_a_model_config_or_a_profile_is_one_line(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(DEEP)
    assert "config.json is nested too deeply" in plan_error(capsys, "--model", str(model))
    prof = write(tmp_path, "p.yaml", DEEP)
    assert "nested too deeply" in plan_error(capsys, "--profile", prof)


def test_a_damaged_gzip_log_is_one_line(tmp_path, capsys):
    whole = gzip.compress(b"".join(b'{"prompt": "a line of words"}\n' for _ in range(5000)))
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    assert "a damaged gzip file" in plan_error(capsys, "--log", str(cut))
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(whole[:20] + bytes(200) + whole[220:])
    assert "a damaged gzip file" in plan_error(capsys, "--log", str(bad))


@pytest.mark.parametrize(("members", "words"), [
    (None, "not a WEKA trace archive"),
    ({"trace_1.json": b"[1, 2, 3]"}, "a WEKA trace is a JSON object"),
    ({"trace_1.json": b'{"requests": [{"t": 0, "hash_ids": [[1]]}]}'}, "hash_ids must be a list of ints"),
    ({"trace_1.json": b'{"requests": [7]}'}, "a request must be a JSON object, got 7"),
    ({"trace_1.json": b'{"requests": {"a": 1}}'}, "a WEKA trace is a JSON object with a list of requests"),
    ({"trace_1.json": DEEP.encode()}, "nested too deeply"),
])
def test_a_hostile_weka_archive_is_one_line(tmp_path, capsys, members, words):
    path = write(tmp_path, "junk.tar.gz", b"not a tar at all") if members is None else weka(tmp_path, members)
    assert words in plan_error(capsys, "--log", path)


def test_a_profile_speed_of_401_digits_is_one_line(tmp_path, capsys):
    prof = write(tmp_path, "p.yaml", f"kvoffload_profile: 1\nengine: {{step_s: 0.001, token_s: {BIG}}}\n")
    assert "engine.token_s = an integer of about 401 digits: give a finite number > 0" in plan_error(
        capsys, "--profile", prof)


# ---- items 3 and 5: a log spanning years ----------------------------------------------------------

def test_an_epoch_timestamp_among_relative_ones_plans_in_bounded_memory(tmp_path, capsys):
    """The busiest-second window used to allocate one bin per second of the span: 12.7 GiB here."""
    lines = [{"prompt_token_ids": list(range(10, 60)), "timestamp": t, "session": "a"} for t in (0, 1, 9e10)]
    log = write(tmp_path, "log.jsonl", "".join(json.dumps(x) + "\n" for x in lines))
    with within(30):
        assert cli.main(["plan", "--log", log, "--model", "tiny", "--tiers", "cpu:1MiB"]) == 0
    out = capsys.readouterr().out
    assert "note: the log pauses 1,041,666.7 days between its requests 2 and 3" in out


def test_bench_serve_cuts_a_years_long_pause_and_says_so(tmp_path):
    from kvoffload.bench.serve_workloads import MAX_IDLE_S, request_log

    lines = [{"prompt_token_ids": list(range(10, 60)), "timestamp": t, "session": "a"} for t in (0, 1, 1.7e9, 1.7e9 + 2)]
    wl = request_log(write(tmp_path, "log.jsonl", "".join(json.dumps(x) + "\n" for x in lines)))
    (s,) = wl.sessions
    assert s.thinks == (0.0, 1.0, MAX_IDLE_S, 2.0)
    assert "the replay spans 63.0 s (4 requests); 1 pause(s) between requests longer than 60 s" in wl.note
    assert "before line 3" in wl.note


# ---- item 4: memory bombs ---------------------------------------------------------------------------

def test_a_line_past_the_bound_is_refused_by_its_number():
    data = b'{"prompt": "a"}\n\n' + b"x" * 5000 + b"\n"
    with _bytes_file(data) as path, pytest.raises(RequestLogError, match=r"line 3: longer than 0 MiB; a log holds"):
        list(read_lines(path, max_line=4096, chunk_bytes=1000))


def test_a_gzipped_2_gib_line_is_refused_without_reading_it_whole(tmp_path, capsys):
    p = tmp_path / "bomb.jsonl.gz"
    with gzip.open(p, "wb", compresslevel=9) as f:
        f.write(b'{"prompt": "')
        block = b"a" * (1 << 20)
        for _ in range(200):  # 200 MiB: past the 64 MiB bound, 200 KB on disk
            f.write(block)
    started = time.monotonic()
    assert "line 1: longer than 64 MiB" in plan_error(capsys, "--log", str(p))
    assert time.monotonic() - started < 15


def test_gzipped_newlines_are_skipped_at_c_speed(tmp_path, capsys):
    p = tmp_path / "newlines.jsonl.gz"
    with gzip.open(p, "wb", compresslevel=9) as f:
        for _ in range(256):  # 256 MiB of newlines, about 250 KB on disk
            f.write(b"\n" * (1 << 20))
        f.write(b'{"prompt": "hi", "timestamp": NaN}\n')
    started = time.monotonic()
    err = plan_error(capsys, "--log", str(p), seconds=60)
    assert f"line {256 * (1 << 20) + 1}: timestamp must be a finite number" in err
    assert time.monotonic() - started < 30


@contextlib.contextmanager
def _bytes_file(data: bytes) -> Iterator[Path]:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "log.jsonl"
        path.write_bytes(data)
        yield path


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([b"a", b"b", b" ", b"\n", b"\r", b"\t"]), max_size=80),
       st.integers(min_value=1, max_value=9))
def test_lines_are_what_splitlines_finds_whatever_the_chunks(parts, chunk):
    data = b"".join(parts)
    want = [(i + 1, line.decode()) for i, line in enumerate(data.split(b"\n")) if line.strip()]
    with _bytes_file(data) as path:
        got = list(read_lines(path, chunk_bytes=chunk))
    assert [(n, t.strip()) for n, t in got] == [(n, t.strip()) for n, t in want]


# ---- item 5: misleading answers ---------------------------------------------------------------------

def test_a_tier_smaller_than_a_block_is_refused(capsys):
    assert "--tiers cpu:1B: smaller than one block" in plan_error(capsys, "--tiers", "cpu:{1,2,3}B")


def test_json_to_an_unwritable_path_fails_before_the_replay(tmp_path, capsys):
    err = plan_error(capsys, "--json", str(tmp_path / "no" / "such" / "dir" / "plan.json"), seconds=5)
    assert "--json" in err and "cannot be written" in err
    assert not (tmp_path / "no").exists()


def test_a_directory_log_and_non_utf8_bytes_are_named(tmp_path, capsys):
    assert "a directory; give a request log file inside it" in plan_error(capsys, "--log", str(tmp_path))
    log = write(tmp_path, "log.jsonl", b'{"prompt": "fine"}\n{"prompt": "caf\xe9"}\n')
    assert "line 2: not UTF-8 (byte 0xe9 at byte 16); save the log as UTF-8" in plan_error(capsys, "--log", log)


def test_plan_does_not_suggest_an_option_it_lacks(tmp_path, capsys):
    log = write(tmp_path, "log.jsonl", '{"prompt_token_ids": [1, -5]}\n')
    err = plan_error(capsys, "--log", log)
    assert "prompt_token_ids must be a non-empty list of ints" in err and "--vocab" not in err


# ---- the Hypothesis sweep: arbitrary JSON to every reader ------------------------------------------

_SCALARS = (st.none() | st.booleans() | st.integers(min_value=-(10**400), max_value=10**400)
            | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8)
            | st.sampled_from(["nan", "Infinity", "1e400", "-1"]))
_VALUES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8)
_KEYS = st.sampled_from(["prompt", "prompt_token_ids", "messages", "timestamp", "session", "user", "max_tokens",
                         "duration_s", "body", "hash_ids", "input_length", "t", "requests", "type", "stop"])
_FIELDS = st.dictionaries(_KEYS, _VALUES | st.just([1, 2, 3]) | st.just("hello world"), max_size=5)


def _dump(value: object) -> str:
    try:
        return json.dumps(value)
    except ValueError:  # an integer past Python's digit limit: what a hostile writer could still send
        return "0"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                    HealthCheck.too_slow])
@given(st.lists(_FIELDS | _VALUES, min_size=1, max_size=4), st.sampled_from(["openai", "mooncake", "weka"]))
def test_any_json_ends_in_a_log_or_one_reader_error(tmp_path_factory, lines, form):
    tmp = tmp_path_factory.mktemp("fuzz")
    if form == "mooncake":  # the first line decides the form
        lines = [{"hash_ids": [1, 2], "timestamp": 0}, *lines]
    if form == "weka":
        path = weka(tmp, {"trace_0.json": json.dumps({"id": "x", "requests": lines}, default=str).encode()})
    else:
        path = write(tmp, "log.jsonl", "".join(_dump(x) + "\n" for x in lines))
    with within(20):
        try:
            log = read_log(path, 16, vocab=1 << 62)
        except RequestLogError as exc:
            assert "\n" not in str(exc) and len(str(exc)) < 1000
            return
    assert log.requests and all(0 <= r.t < 1e12 and r.prompt_tokens >= 1 for r in log.requests)
    with within(20):  # and whatever a reader accepts, a plan prices
        plan = make_plan(log, [parse_chain("cpu:1MiB")], 4096, 8, load_profile(None))
    assert plan.results[0].ttft_p50_s >= 0


def test_a_gzip_bomb_is_refused_by_its_ratio(tmp_path, capsys, monkeypatch):
    """Past a GiB of text (8 MiB here), a gzipped log unpacking to more than 200x its size on disk
    is refused: 64 MB of gzipped newlines would otherwise be read to the 64 GiB bound (minutes)."""
    from kvoffload import log_lines

    monkeypatch.setattr(log_lines, "BOMB_AFTER_BYTES", 8 << 20)
    p = tmp_path / "bomb.jsonl.gz"
    with gzip.open(p, "wb", compresslevel=9) as f:
        f.write(b'{"prompt": "fine"}\n' + b"\n" * (32 << 20))
    err = plan_error(capsys, "--log", str(p))
    assert "x its size on disk" in err and "split the log" in err
    ok = tmp_path / "ok.jsonl.gz"  # an ordinary log compresses far less: read whole
    ok.write_bytes(gzip.compress(b"".join(json.dumps({"prompt_token_ids": list(range(i, i + 3000))}).encode() + b"\n"
                                          for i in range(1000))))
    assert [n for n, _ in read_lines(ok)][-1] == 1000

