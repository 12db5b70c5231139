"""kvoffload inside a real `vllm serve` (CPU build, tiny local Llama), over HTTP: the same
prompts twice with the prefix cache reset between, then a Prometheus scrape of /metrics."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from kvoffload.testing.health import wait_healthy  # noqa: E402

PROMPTS = [[(i * 37 + j) % 500 + 1 for j in range(300)] for i in range(3)]


def _post(url: str, body: dict | None = None) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body or {}).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        text = resp.read().decode()
    return json.loads(text) if text.strip() else {}


def _metrics(base: str) -> dict[tuple[str, tuple], float]:
    text = urllib.request.urlopen(f"{base}/metrics", timeout=30).read().decode()
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("engine", "model_name")))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


@pytest.fixture
def serve(model, tmp_path):
    procs, logs = [], []

    def start(kv_transfer_config: dict, env: dict | None = None, extra: tuple[str, ...] = (), dev_mode: bool = True) -> str:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        log = open(tmp_path / "serve.log", "w")  # noqa: SIM115 - the server writes it until teardown
        logs.append(log)
        proc = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--port", str(port),
             "--host", "127.0.0.1", "--skip-tokenizer-init", "--max-model-len", "1024", "--dtype", "bfloat16",
             "--enforce-eager", "--seed", "0", "--enable-prompt-tokens-details", "--gpu-memory-utilization", "0.1",
             "--kv-transfer-config", json.dumps(kv_transfer_config), *extra],
            stdout=log, stderr=subprocess.STDOUT,
            env={**{k: v for k, v in os.environ.items() if k != "VLLM_SERVER_DEV_MODE"},
                 **({"VLLM_SERVER_DEV_MODE": "1"} if dev_mode else {}), **(env or {})})
        procs.append(proc)
        base = f"http://127.0.0.1:{port}"
        wait_healthy(base, proc, "vllm serve", 400, lambda: (tmp_path / "serve.log").read_text()[-3000:], poll_s=2)
        return base

    yield start
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    for log in logs:
        log.close()


def _round(base: str, model: str) -> list[int]:
    cached = []
    for prompt in PROMPTS:
        out = _post(f"{base}/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 4, "temperature": 0})
        details = out["usage"].get("prompt_tokens_details") or {}
        cached.append(details.get("cached_tokens") or 0)
    return cached


def test_vllm_serve_reports_kvoffload_hits_in_its_metrics(model, serve):
    base = serve({"kv_connector": "KVOffloadConnector", "kv_role": "kv_both",
                  "kv_connector_extra_config": {"config": {"tiers": [{"medium": "cpu", "capacity": "64MiB"}]}}})
    assert _round(base, model) == [0, 0, 0]
    time.sleep(1)  # stores of the last request land
    _post(f"{base}/reset_prefix_cache")
    cached = _round(base, model)
    assert all(c >= 256 for c in cached)  # the device cache was reset: these came from kvoffload
    deadline = time.time() + 30
    while time.time() < deadline:  # stats reach the API server with the engine's next report
        m = _metrics(base)
        if m.get(("kvoffload_hit_tokens_total", (("tier", "cpu"),))) == sum(cached):
            break
        time.sleep(1)
    assert m[("kvoffload_hit_tokens_total", (("tier", "cpu"),))] == sum(cached)
    assert m[("kvoffload_loaded_blocks_total", ())] == sum(cached) // 128
    assert m[("kvoffload_stored_blocks_total", ())] >= 6
    assert m[("kvoffload_transfer_bytes_total", (("direction", "host_to_device"),))] == 65536 * sum(cached) // 128
    # The same vocabulary as the bundled engine: per-copy histograms and tier gauges.
    loads = m[("kvoffload_transfer_jobs_total", (("direction", "host_to_device"),))]
    assert m[("kvoffload_transfer_seconds_count", (("direction", "host_to_device"),))] == loads > 0
    assert m[("kvoffload_transfer_size_bytes_sum", (("direction", "host_to_device"),))] == 65536 * sum(cached) // 128
    assert m[("kvoffload_tier_capacity_blocks", (("tier", "cpu"),))] == 64 * 2**20 // 65536
    assert m[("kvoffload_tier_used_blocks", (("tier", "cpu"),))] >= 6
    # `bench profile --from URL` calibrates a profile from this server's own figures (#71).
    from kvoffload.bench.profile_scrape import profile_from_server

    profile = profile_from_server(base, model, "the served model", 1)
    assert profile.engine.token_s > 0 and profile.engine.max_batched_tokens > 0
    assert set(profile.tiers) == {"cpu"} and profile.tiers["cpu"].load_gb_per_s > 0
    assert profile.sources["tiers.cpu"].startswith("loads: kvoffload_tier_load_bytes_per_second")
    assert f"{base}, in service" in profile.machine
    assert 0 < profile.engine.request_s < 5  # its front end: vLLM's TTFT less its engine core's queue and prefill
    # The external reset reaches kvoffload: nothing stored before it is served after it.
    assert _post(f"{base}/reset_prefix_cache?reset_external=true") == {"success": True}
    assert _round(base, model) == [0, 0, 0]


def test_the_docs_first_check_sees_a_cpu_tier_hit_without_dev_mode(model, serve):
    """#84 item 7, docs/vllm.md's first check: no VLLM_SERVER_DEV_MODE, no /reset_prefix_cache;
    a device cache that holds about one prompt, prompts A, B, C, then A again: A's blocks left
    the device for B's and C's, and come back from the CPU tier, as /metrics and the answer's
    cached tokens both show."""
    base = serve({"kv_connector": "KVOffloadConnector", "kv_role": "kv_both",
                  "kv_connector_extra_config": {"config": {"tiers": [{"medium": "cpu", "capacity": "64MiB"}]}}},
                 extra=("--num-gpu-blocks-override", "5", "--max-model-len", "512"), dev_mode=False)
    with pytest.raises(urllib.error.HTTPError):
        _post(f"{base}/reset_prefix_cache")  # not there without dev mode: the check must not need it
    assert _round(base, model) == [0, 0, 0]  # A, B, C: nothing to reuse yet
    time.sleep(1)  # stores of the last request land
    again = _post(f"{base}/v1/completions", {"model": model, "prompt": PROMPTS[0], "max_tokens": 4, "temperature": 0})
    assert (again["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0) >= 256
    deadline = time.time() + 30
    while time.time() < deadline:
        hits = _metrics(base).get(("kvoffload_hit_tokens_total", (("tier", "cpu"),)), 0)
        if hits > 0:
            break
        time.sleep(1)
    assert hits >= 128  # at least one of A's blocks came back from the CPU tier


def test_vllm_serve_spec_route_feeds_vllms_offload_metrics(model, serve):
    base = serve({"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                  "kv_connector_extra_config": {"spec_name": "KVOffloadSpec",
                                                "spec_module_path": "kvoffload.integrations.vllm_spec",
                                                "config": {"tiers": [{"medium": "cpu", "capacity": "64MiB"}],
                                                           "store_threshold": 2}}})
    for _ in range(2):  # the reuse filter stores on the second sighting
        assert _round(base, model) == [0, 0, 0]
        time.sleep(1)
        _post(f"{base}/reset_prefix_cache")
    cached = _round(base, model)
    assert all(c >= 256 for c in cached)
    deadline = time.time() + 30
    while time.time() < deadline:
        m = _metrics(base)
        if m.get(("vllm:kv_offload_load_bytes_total", ())):
            break
        time.sleep(1)
    assert m[("vllm:kv_offload_stores_skipped_total", ())] == 6  # first sightings: 3 prompts x 2 chunks
    assert m[("vllm:kv_offload_load_bytes_total", ())] == 65536 * sum(cached) // 128
    assert ("vllm:kv_offload_cpu_cache_usage_perc", ()) in m
    assert m[("vllm:kv_offload_cpu_allocation_size_count", ())] >= 3


def test_vllm_serve_passes_request_hints_to_the_policy_and_survives_hostile_ones(model, serve, tmp_path):
    """``kv_transfer_params={"kvoffload": {...}}`` in the OpenAI body reaches the hinted policy in
    the engine core: counted at each request's lookup and finish, logged by the policy at debug
    level; a bad hint is one warning and the request is served as without it. Then, on the same
    server, arbitrary JSON in every hint field (Hypothesis): every request is answered (200, or
    vLLM's own 400 for what its JSON layer refuses), served with the tokens of the same prompt
    unhinted, and the server keeps serving plain requests afterwards."""
    # A small tier (hostile hints below must evict under the policy); every token of the tiny
    # model's vocabulary counts as a tool-call token: each finish is read as a tool call (the
    # output tokens reach the connector at the finish); the operator lets clients raise priority.
    config = {"tiers": [{"medium": "cpu", "capacity": "2MiB", "eviction_policy": "hinted"}],
              "hints": {"tool_call_token_ids": list(range(512)), "tool_return_s": 7, "max_priority": 1000}}
    base = serve({"kv_connector": "KVOffloadConnector", "kv_role": "kv_both",
                  "kv_connector_extra_config": {"config": config}}, env={"KVOFFLOAD_LOG_LEVEL": "debug"})

    def complete(prompt: list[int], params: dict | None) -> dict:
        body = {"model": model, "prompt": prompt, "max_tokens": 4, "temperature": 0, "return_token_ids": True}
        if params is not None:
            body["kv_transfer_params"] = params
        return _post(f"{base}/v1/completions", body)

    plain = complete(PROMPTS[0], None)["choices"][0]["token_ids"]
    hinted = [complete(p, {"kvoffload": {"session": f"agent-{i}", "expect_return_s": 5, "priority": 1}})
              for i, p in enumerate(PROMPTS)]
    bad = [complete(PROMPTS[0], {"kvoffload": {"priority": "high", "session": ""}}) for _ in range(2)]
    assert [o["choices"][0]["finish_reason"] for o in hinted + bad] == ["length"] * 5
    deadline = time.time() + 30
    while time.time() < deadline:
        m = _metrics(base)
        if m.get(("kvoffload_tool_call_finishes_total", ())) == 6:
            break
        time.sleep(1)
    assert m[("kvoffload_hinted_requests_total", ())] == 3
    assert m[("kvoffload_tool_call_finishes_total", ())] == 6  # every request, the plain and bad ones too
    # The 3 hinted requests at lookup and finish; the plain and bad ones at finish (a tool call).
    assert m[("kvoffload_hints_given_total", ())] == 3 * 2 + 3
    assert len(plain) == 4 and plain == bad[0]["choices"][0]["token_ids"] == bad[1]["choices"][0]["token_ids"]
    log = (tmp_path / "serve.log").read_text()
    for i in range(3):  # the policy itself saw each session: first due back in 5 s, then in 5 s again
        assert log.count(f"hinted policy: session agent-{i} back in 5.0 s, priority 1") == 2, log[-3000:]
    # Unhinted requests, after a tool call: a session of their own, back in tool_return_s.
    assert log.count("back in 7.0 s, priority 0") == 3
    assert log.count("hint priority='high'") == 1 and log.count("hint session=''") == 1

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    def complete_any(prompt: list[int], params: object = None) -> tuple[int, list[int] | None]:
        body = {"model": model, "prompt": prompt, "max_tokens": 3, "temperature": 0, "return_token_ids": True}
        if params is not None:
            body["kv_transfer_params"] = {"kvoffload": params}
        req = urllib.request.Request(f"{base}/v1/completions", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                return resp.status, json.loads(resp.read())["choices"][0]["token_ids"]
        except urllib.error.HTTPError as exc:
            return exc.code, None

    plain_all = [complete_any(p)[1] for p in PROMPTS]
    leaf = st.none() | st.booleans() | st.integers(-(10**30), 10**30) | st.floats() | st.text(max_size=30)
    value = st.recursive(leaf, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
                         max_leaves=8) | st.text(min_size=300, max_size=5000)
    hint = st.one_of(value, st.fixed_dictionaries({}, optional={
        "session": value, "expect_return_s": value, "priority": value, "lease_s": value, "other": value}))
    statuses = []

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.integers(0, len(PROMPTS) - 1), hint)
    def flood(i: int, h: object) -> None:
        status, tokens = complete_any(PROMPTS[i], h)
        statuses.append(status)
        assert status in (200, 400)
        if status == 200:
            assert tokens == plain_all[i]

    flood()
    assert statuses.count(200) > len(statuses) // 2  # most hostile hints reach kvoffload, not only vLLM's checks
    assert [complete_any(p)[1] for p in PROMPTS] == plain_all
    m = _metrics(base)
    assert m[("kvoffload_lookups_total", ())] > 0
