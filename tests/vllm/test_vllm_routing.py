"""KV-aware routing on the real router: two `vllm serve` replicas (CPU build, tiny Llama, a
16-block device cache) publish their KV events over ZMQ; Dynamo's standalone selection service
(ai-dynamo-runtime 1.6.1, in a venv of its own: KVOFFLOAD_DYNAMO_PYTHON) indexes them; the
example gateway (kvoffload.integrations.dynamo_gateway, examples/routing/gateway.py) asks it and forwards.

Conversation A runs on replica 1; filler traffic pushes A out of replica 1's device cache into
kvoffload's host tier (or, with a small host tier, on to disk); replica 2 holds A's first two
blocks on its device. The service must see both, and A's next turn must go to replica 1, which
serves it from kvoffload; with the host (disk) tier's credit lowered, replica 2 wins. The same
placement through vllm-router's kv_aware policy (KVOFFLOAD_VLLM_ROUTER) sends A to replica 1 too.
Every wait polls the service's state; nothing sleeps and hopes. The disk variant runs with
KVOFFLOAD_ROUTING_TESTS=all (one routing test in CI)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kvoffload.testing.mooncake_master import free_port  # below the kernel's ephemeral range

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

DYNAMO = os.environ.get("KVOFFLOAD_DYNAMO_PYTHON", "")
#: vllm-router's binary, for the test of its kv_aware policy (.ci/run installs it beside Dynamo).
VLLM_ROUTER = os.environ.get("KVOFFLOAD_VLLM_ROUTER", "")
if not DYNAMO or not Path(DYNAMO).exists():
    pytest.skip("KVOFFLOAD_DYNAMO_PYTHON: set it to a python with ai-dynamo-runtime==1.6.1 (.ci/run makes one)",
                allow_module_level=True)

from kvoffload.testing.health import answers  # noqa: E402

BLOCK = 128
A = [(7 * j) % 500 + 1 for j in range(5 * BLOCK)]  # conversation A: five full blocks
TURN = A + [(11 * j) % 500 + 1 for j in range(BLOCK)]  # A's next turn
FILLERS = [[(i * 53 + j * 3) % 500 + 1 for j in range(5 * BLOCK)] for i in range(1, 5)]


def partial_a(blocks: int) -> list[int]:
    """A's first blocks, then other tokens."""
    return A[: blocks * BLOCK] + [(13 * j) % 500 + 1 for j in range(BLOCK)]


def post(url: str, body: Any = None) -> Any:
    req = urllib.request.Request(url, data=json.dumps(body or {}).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        return json.loads(resp.read() or b"{}"), resp.headers


def wait_for(what: str, probe: Callable[[], Any], timeout_s: float = 120.0) -> Any:
    deadline = time.time() + timeout_s
    last = None
    while time.time() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}; last state: {last}")


class Fleet:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.procs: list[subprocess.Popen] = []
        self.logs: list[Any] = []

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "w")  # noqa: SIM115 - closed at teardown
        self.logs.append(log)
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        self.procs.append(proc)
        return proc

    def replica(self, name: str, model: str, tiers: list[dict]) -> tuple[str, str, str, subprocess.Popen]:
        port, pub, replay = free_port(), free_port(), free_port()
        events = {"enable_kv_cache_events": True, "publisher": "zmq", "topic": "",
                  "endpoint": f"tcp://*:{pub}", "replay_endpoint": f"tcp://*:{replay}"}
        ktc = {"kv_connector": "KVOffloadConnector", "kv_role": "kv_both",
               "kv_connector_extra_config": {"config": {"tiers": tiers}}}
        proc = self.spawn(name, [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--port", str(port),
            "--host", "127.0.0.1", "--skip-tokenizer-init", "--max-model-len", "1024", "--dtype", "bfloat16",
            "--enforce-eager", "--seed", "0", "--enable-prompt-tokens-details", "--gpu-memory-utilization", "0.1",
            "--num-gpu-blocks-override", "16", "--block-size", str(BLOCK),
            "--kv-transfer-config", json.dumps(ktc), "--kv-events-config", json.dumps(events)])
        return f"http://127.0.0.1:{port}", f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{replay}", proc

    def selector(self, name: str, env: dict[str, str]) -> str:
        port = free_port()
        proc = self.spawn(name, [DYNAMO, "-m", "dynamo.select_service", "--port", str(port), "--threads", "1"], env)
        base = f"http://127.0.0.1:{port}"
        wait_for(f"{name} to start", lambda: proc.poll() is None and _up(f"{base}/health"), 60)
        return base

    def vllm_router(self, model: str, events: dict[str, tuple[str, str]]) -> str:
        """vllm-router's kv_aware policy over the replicas (KVOFFLOAD_VLLM_ROUTER: its binary)."""
        port = free_port()
        argv = [VLLM_ROUTER, "--port", str(port), "--host", "127.0.0.1", "--policy", "kv_aware",
                "--kv-event-block-size", str(BLOCK), "--kv-event-model", model, "--worker-urls", *events]
        for url, (pub, replay) in events.items():
            argv += ["--kv-event-source", f"{url}={pub}", "--kv-event-replay-source", f"{url}={replay}"]
        proc = self.spawn("vllm-router", argv)
        base = f"http://127.0.0.1:{port}"
        wait_for("vllm-router to start", lambda: _up(f"{base}/health") or (proc.poll() is not None and pytest.fail(
            f"vllm-router exited:\n{self.tail()}")), 120)
        return base

    def close(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        for log in self.logs:
            log.close()

    def tail(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(self.tmp.glob("*.log")))


_up = answers  # the start-up probe every harness shares (kvoffload.testing.health)


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(tmp_path)
    try:
        yield f
    finally:
        f.close()


def overlap(selector: str, tokens: list[int]) -> dict[int, dict[str, int]]:
    out, _ = post(f"{selector}/overlap_scores", {"model_name": "default", "token_ids": tokens})
    return {w["worker_id"]: w for w in out["workers"]}


def complete(base: str, model: str, prompt: list[int]) -> tuple[dict, Any]:
    return post(f"{base}/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 2, "temperature": 0})


# Dynamo credits a host block 0.75 and a disk block 0.25 of a device block by default. Host: 5
# host blocks (3.75) beat 2 device blocks, and lose at 0.2 (1.0). Disk: 5 disk blocks (1.25) beat
# 1 device block, and lose at 0.1 (0.5).
# vllm-router's kv_aware policy reads the same events (its own credits: host 0.8, disk 0.3).
@pytest.mark.parametrize(("router", "tier", "r2_blocks", "low_credit"),
                         [("dynamo", "host", 2, "0.2"), ("dynamo", "disk", 1, "0.1"), ("vllm-router", "host", 2, "0.2")])
def test_a_returning_conversation_is_routed_to_the_replica_whose_kvoffload_tier_holds_it(
        model, fleet, tmp_path, router, tier, r2_blocks, low_credit):
    if tier == "disk" and os.environ.get("KVOFFLOAD_ROUTING_TESTS") != "all":
        pytest.skip("the disk variant runs with KVOFFLOAD_ROUTING_TESTS=all")
    if router == "vllm-router" and not VLLM_ROUTER:
        pytest.skip("KVOFFLOAD_VLLM_ROUTER: set it to vllm-router's binary (pip install vllm-router==0.1.17)")
    # Host tier: 64 MiB. Disk: a host tier of 8 blocks (65536 bytes each) demotes A to disk.
    tiers = ([{"medium": "cpu", "capacity": "64MiB"}] if tier == "host" else
             [{"medium": "cpu", "capacity": 8 * 65536},
              {"medium": "disk", "path": str(tmp_path / "disk"), "capacity": "64MiB"}])
    weight = "DYN_ROUTER_HOST_CACHE_HIT_WEIGHT" if tier == "host" else "DYN_ROUTER_DISK_CACHE_HIT_WEIGHT"
    counted = "host_pinned_blocks" if tier == "host" else "disk_blocks"
    r1, pub1, replay1, p1 = fleet.replica("replica1", model, tiers)
    r2, pub2, replay2, p2 = fleet.replica("replica2", model, [{"medium": "cpu", "capacity": "64MiB"}])
    selectors = {"default": fleet.selector("select-default", {}),
                 "low": fleet.selector("select-low", {weight: low_credit})}
    for base, proc in ((r1, p1), (r2, p2)):
        wait_for(f"{base} to serve", lambda b=base, p=proc: _up(f"{b}/health") or (p.poll() is not None and
                 pytest.fail(f"a replica exited:\n{fleet.tail()}")), 400)
    vllm_router = fleet.vllm_router(model, {r1: (pub1, replay1), r2: (pub2, replay2)}) if router != "dynamo" else None
    from kvoffload.integrations import dynamo_gateway as gw

    workers = {1: r1, 2: r2}
    for selector in selectors.values():
        gw.register(selector, workers, {1: (pub1, replay1), 2: (pub2, replay2)}, BLOCK)

    complete(r1, model, A)
    wait_for("A on replica 1's device", lambda: overlap(selectors["default"], A)[1]["device_blocks"] == 5)
    for filler in FILLERS:  # 20 more blocks through a 16-block device cache
        complete(r1, model, filler)
    complete(r2, model, partial_a(r2_blocks))

    def placed() -> dict[int, dict[str, int]] | None:
        seen = overlap(selectors["default"], TURN)
        one, two = seen.get(1, {}), seen.get(2, {})
        ok = one.get("device_blocks") == 0 and one.get(counted) == 5 and two.get("device_blocks") == r2_blocks
        return seen if ok else None

    try:
        seen = wait_for(f"replica 1's {tier} blocks of A and replica 2's device blocks", placed)
    except AssertionError:
        raise AssertionError(f"{overlap(selectors['default'], TURN)}\n{fleet.tail()}") from None
    assert seen[2][counted] == r2_blocks  # replica 2's own host copy of the same blocks

    # Asked first: A's next turn, once served, puts A back on replica 1's device.
    low, _ = post(f"{selectors['low']}/select", {"model_name": "default", "token_ids": TURN})
    assert low["worker_id"] == 2, low

    if vllm_router is not None:
        # The same ZMQ streams reached it as reached the service above (state polled there). The
        # replica it picks tells itself: replica 1 serves A's 5 blocks from kvoffload's tier,
        # replica 2 would serve 2 from its device (without the tier's events, replica 2 wins).
        out, _ = complete(vllm_router, model, TURN)
        assert out["usage"]["prompt_tokens_details"]["cached_tokens"] == 5 * BLOCK
        return

    port = free_port()
    server = gw.serve(gw.Gateway(selectors["default"], workers, explain=True, affinity=True), "127.0.0.1", port)
    gateway = f"http://127.0.0.1:{port}/v1/completions"
    try:
        out, headers = post(gateway, {"model": model, "prompt": TURN, "max_tokens": 2, "temperature": 0, "user": "A"})
        # A new conversation no replica holds anything of opens where fewer conversations live:
        # replica 2, though a pending prompt reserved there makes the service's own choice
        # replica 1 (the gateway offers it only replica 2, and the service takes the offer).
        fresh = [(17 * j) % 500 + 1 for j in range(BLOCK)]
        post(f"{selectors['default']}/select_and_reserve", {
            "selection_id": "pending", "model_name": "default", "token_ids": [(19 * j) % 500 + 1 for j in range(4 * BLOCK)],
            "pinned_worker": {"worker_id": 2, "dp_rank": 0}})
        free, _ = post(f"{selectors['default']}/select", {"model_name": "default", "token_ids": fresh})
        assert free["worker_id"] == 1, free
        _, opened = post(gateway, {"model": model, "prompt": fresh, "max_tokens": 2, "temperature": 0, "user": "B"})
    finally:
        server.shutdown()
    assert opened["x-kvoffload-worker"] == "2" and opened["x-kvoffload-seen"] == "1=0/0/0,2=0/0/0"
    assert headers["x-kvoffload-worker"] == "1"
    # What the service saw when it chose (its /overlap_scores, as polled above): A in replica 1's tier.
    assert headers["x-kvoffload-seen"] == ",".join(
        f"{w}={seen[w]['device_blocks']}/{seen[w]['host_pinned_blocks']}/{seen[w]['disk_blocks']}" for w in (1, 2))
    assert out["usage"]["prompt_tokens_details"]["cached_tokens"] == 5 * BLOCK  # served from kvoffload's tier
