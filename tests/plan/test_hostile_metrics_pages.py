"""``bench profile --from URL`` against a hostile metrics endpoint (round 7): pages that drip or
never end, labels that keep a parser busy for minutes, values whose sums overflow, step sizes of
twenty digits; and ``plan`` on a profile whose idle step is no time. Each ends, in bounded time,
in a profile ``plan`` accepts or in one line naming the metric and the fix."""

from __future__ import annotations

import contextlib
import http.server
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvoffload import cli
from kvoffload.bench.profile_scrape import scrape
from kvoffload.plan.profile import ProfileError, load_profile
from tests.test_gateway_faults import RawServer

GOOD = (b'kvoffload_prefill_tokens_per_second{tokens="16"} 2000\n'
        b'kvoffload_prefill_tokens_per_second{tokens="128"} 9000\n'
        b'kvoffload_tier_load_bytes_per_second{tier="cpu"} 2e9\n'
        b'kvoffload_tier_load_latency_seconds{tier="cpu"} 0.0001\n')


def metrics_page(send) -> RawServer:  # type: ignore[no-untyped-def]
    """A /metrics endpoint whose handler reads the request, then lets ``send(sock)`` answer."""
    def handle(sock: socket.socket, stop: threading.Event) -> None:
        sock.recv(65536)
        with contextlib.suppress(OSError):
            send(sock, stop)
    return RawServer(handle)


def whole(body: bytes):  # type: ignore[no-untyped-def]
    def send(sock: socket.socket, stop: threading.Event) -> None:
        sock.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    return send


@pytest.fixture
def page():
    made: list[RawServer] = []

    def make(send) -> RawServer:  # type: ignore[no-untyped-def]
        made.append(metrics_page(send))
        return made[-1]
    yield make
    for p in made:
        p.close()


def test_a_page_sent_a_byte_at_a_time_is_cut_at_the_deadline(page):
    """400 bytes a byte every 0.5 s was still being read after 60 s (the timeout bounded each
    receive)."""
    def drip(sock: socket.socket, stop: threading.Event) -> None:
        data = b"HTTP/1.0 200 OK\r\nContent-Length: 400\r\n\r\n" + b"#" * 400
        for i in range(len(data)):
            if stop.wait(0.05):
                return
            sock.sendall(data[i:i + 1])

    t0 = time.monotonic()
    with pytest.raises(ProfileError, match="did not arrive whole within 1 s"):
        scrape(page(drip).url, timeout_s=1.0)
    assert time.monotonic() - t0 < 2.0


def test_a_chunked_page_that_never_ends_is_cut_at_the_deadline(page):
    def endless(sock: socket.socket, stop: threading.Event) -> None:
        sock.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        while not stop.wait(0.01):
            sock.sendall(b"2\r\n#\n\r\n")

    t0 = time.monotonic()
    with pytest.raises(ProfileError, match="did not arrive whole within 1 s"):
        scrape(page(endless).url, timeout_s=1.0)
    assert time.monotonic() - t0 < 2.0


def test_a_label_of_megabytes_of_escaped_quotes_is_refused_or_skipped_at_once(page):
    """prometheus_client's label parser is quadratic in escaped quotes: a 5 MB line kept it busy
    for minutes."""
    junk = b'"' + b'\\"' * 2_500_000 + b'"'
    t0 = time.monotonic()
    with pytest.raises(ProfileError, match="a kvoffload_prefill_tokens_per_second line of 5000048 characters"):
        scrape(page(whole(b"kvoffload_prefill_tokens_per_second{tokens=" + junk + b"} 1\n")).url)
    metrics = scrape(page(whole(b"some_other_family{x=" + junk + b"} 1\n" + GOOD)).url)  # not read: skipped
    assert metrics["kvoffload_tier_load_bytes_per_second"] == [({"tier": "cpu"}, 2e9)]
    assert time.monotonic() - t0 < 5.0


def test_a_redirect_is_one_line_naming_where_it_points(page):
    def moved(sock: socket.socket, stop: threading.Event) -> None:
        sock.sendall(b"HTTP/1.0 301 Moved\r\nLocation: /metrics\r\nContent-Length: 0\r\n\r\n")

    with pytest.raises(ProfileError, match=r"answered HTTP 301 \(to '/metrics'\): give that address"):
        scrape(page(moved).url)


BIG = "1" * 400
HOSTILE_PAGES = [
    (f'kvoffload_prefill_tokens_per_second{{tokens="16"}} {BIG}\n'.encode() + GOOD[GOOD.index(b"kvoffload_tier"):],
     "published no kvoffload_prefill_tokens_per_second"),
    (f'kvoffload_prefill_tokens_per_second{{tokens="{BIG}"}} 1000\n'.encode() + GOOD[GOOD.index(b"kvoffload_tier"):],
     "published no kvoffload_prefill_tokens_per_second"),
    (b'kvoffload_prefill_tokens_per_second{tokens="99999999999999999999"} 1000\n', "published no kvoffload_prefill"),
    (b'kvoffload_prefill_tokens_per_second{tokens="16"} 1e-300\nkvoffload_tier_load_bytes_per_second{tier="cpu"} 1\n',
     "(from kvoffload_prefill_tokens_per_second)"),
    (GOOD.replace(b"2e9", b"1.5e308"), None),  # past the bound: left out, the tier unmeasured
    (GOOD + b'vllm:time_to_first_token_seconds_sum{engine="0"} 1.5e308\n'
            b'vllm:time_to_first_token_seconds_sum{engine="1"} 1.5e308\n'
            b'vllm:time_to_first_token_seconds_count{engine="0"} 1\n', None),
    (GOOD + b'kvoffload_step_overhead_seconds{part="idle_step"} 1e-30\n', None),
]


@pytest.mark.parametrize("body, words", HOSTILE_PAGES)
def test_hostile_figures_end_in_a_profile_plan_accepts_or_one_line(page, tmp_path, capsys, body, words):
    """A 400-digit value or tokens label was an OverflowError traceback; sums of finite samples
    overflowed into a written profile of NaN and inf that plan then refused; 1e-300 tokens/s
    wrote a step of 1e287 s; tokens of 20 digits an engine of '0.000 ms a step'."""
    out = tmp_path / "p.yaml"
    rc = cli.main(["bench", "profile", "--from", page(whole(body)).url, "--model", "tiny", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    if words is None:
        assert rc == 0 or "published no tier load speeds" in err
    else:
        assert rc == 2 and words in err
    if rc == 0:
        profile = load_profile(out)
        assert profile.engine.idle_step_s == 0.0 or profile.engine.idle_step_s >= 1e-6
        assert cli.main(["plan", "--log", "sample", "--model", "tiny", "--tiers", "cpu:4MiB",
                         "--profile", str(out)]) == 0
    else:
        assert "\n" not in err and "Traceback" not in err and not out.exists()


numbers = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr), st.integers(-10, 10 ** 30).map(str),
                    st.sampled_from(["1e308", "1.5e308", "1e-300", "-0", BIG, "NaN", "+Inf"]))
labels = st.one_of(st.integers(-5, 10 ** 25).map(str), st.text(max_size=6), st.sampled_from(["16", "\u00b2"]))


@pytest.fixture(scope="module")
def live_page():
    holder = {"body": b""}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(holder["body"])))
            self.end_headers()
            self.wfile.write(holder["body"])

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield holder, f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(st.sampled_from(["kvoffload_prefill_tokens_per_second{tokens=\"%s\"}",
                                                 "kvoffload_tier_load_bytes_per_second{tier=\"cpu%.0s\"}",
                                                 "kvoffload_tier_load_latency_seconds{tier=\"cpu%.0s\"}",
                                                 "kvoffload_step_overhead_seconds{part=\"idle_step%.0s\"}",
                                                 "vllm:time_to_first_token_seconds_sum{engine=\"%s\"}",
                                                 "vllm:time_to_first_token_seconds_count{engine=\"%s\"}"]),
                               labels, numbers), min_size=1, max_size=8))
def test_any_page_of_hostile_figures_is_a_usable_profile_or_one_line(live_page, tmp_path_factory, rows):
    holder, url = live_page
    lines = []
    for template, label, value in rows:
        safe = label.replace("\\", "").replace('"', "").replace("\n", "")
        lines.append(f"{template % safe} {value}")
    holder["body"] = ("\n".join(lines) + "\n").encode()
    out = tmp_path_factory.mktemp("p") / "p.yaml"
    proc_err = _run_cli(["bench", "profile", "--from", url, "--model", "tiny", "--out", str(out)])
    rc, err = proc_err
    assert rc in (0, 2) and "Traceback" not in err
    if rc == 0:
        load_profile(out)  # whatever was written, plan reads back
    else:
        assert len(err.strip().splitlines()) == 1 and not out.exists()


def _run_cli(argv: list[str]) -> tuple[int, str]:
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = cli.main(argv)
    return rc, err.getvalue()


def test_plan_on_a_profile_whose_idle_step_is_no_time_ends_at_once(tmp_path, capsys):
    """idle_step_s: 1e-30 made the replay count ~1e27 empty steps by +-1 loops that float
    arithmetic never ended."""
    prof = tmp_path / "p.yaml"
    prof.write_text("kvoffload_profile: 1\nengine: {step_s: 0.001, token_s: 0.0001, idle_step_s: 1.0e-30}\n"
                    "tiers: {cpu: {load_gb_per_s: 5, store_gb_per_s: 5}}\n")
    assert cli.main(["plan", "--log", "sample", "--model", "tiny", "--tiers", "cpu:4MiB", "--profile", str(prof)]) == 2
    assert "engine.idle_step_s = 1e-30: an idle step below 1e-06 s is not a measurement" in capsys.readouterr().err
    # The replay itself, handed such an engine in code, ends (a child process: the old loop never did).
    code = ("import numpy as np\nfrom kvoffload.plan.profile import EngineSpeed\n"
            "from kvoffload.plan.timing import simulate_ttft\n"
            "eng = EngineSpeed('m', 0.001, 1e-4, idle_step_s=1e-30)\n"
            "r = simulate_ttft(np.zeros(2), np.array([0.0, 0.05]), np.array([64, 64]), np.array([0, 512]),"
            " np.ones(2, dtype=int), eng)\nprint(float(r.ttft[1]))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).parents[2])
    assert done.returncode == 0 and float(done.stdout) >= 0.05, done.stderr[-500:]


@pytest.mark.parametrize("field, value, words", [
    ("max_batched_tokens", "1" * 401, "engine.max_batched_tokens = an integer of about 401 digits: give an integer "
                                      "from 1 to 16777216"),
    ("max_batched_tokens", "100000000000000000000", "give an integer from 1 to 16777216"),
    ("token_s", "1.0e-300", "engine.token_s = 1e-300: faster than 1e-12 s a token is no engine's"),
])
def test_a_profile_of_absurd_engine_figures_is_one_line(tmp_path, capsys, field, value, words):
    """A 401-digit max_batched_tokens was an OverflowError traceback (round 6's last)."""
    engine = {"step_s": "0.001", "token_s": "0.0001", field: value}
    prof = tmp_path / "p.yaml"
    prof.write_text("kvoffload_profile: 1\nengine: {" + ", ".join(f"{k}: {v}" for k, v in engine.items()) + "}\n")
    assert cli.main(["plan", "--log", "sample", "--model", "tiny", "--tiers", "cpu:4MiB", "--profile", str(prof)]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err
