"""A new user's first commands: `kvoffload run` with no arguments (a packaged CPU example),
examples by name, per-user disk path, swap without a tier refused, plugins from the current
directory."""

import subprocess
import sys
import textwrap

from kvoffload.cli import main
from kvoffload.config import OffloadConfig, default_cache_dir
from kvoffload.examples import known_examples, resolve_config


def test_packaged_examples_resolve_by_name_and_paths_pass_through(tmp_path):
    assert {"cpu", "cpu_disk", "research_arc"} <= set(known_examples())
    assert resolve_config("cpu").endswith("kvoffload/examples/cpu.yaml")
    own = tmp_path / "cpu"  # a file the user has by that name wins
    own.write_text("tiers: [{medium: cpu, capacity: 1MiB}]\n")
    assert resolve_config(str(own)) == str(own)
    assert resolve_config("nope.yaml") == "nope.yaml"  # left for the loader's one-line error
    disk = OffloadConfig.from_yaml(resolve_config("cpu_disk"))
    assert disk.tiers[1].path == str(default_cache_dir()) and not disk.tiers[1].path.startswith("~")


def test_run_with_no_arguments_compares_with_the_cpu_example(capsys):
    assert main(["run", "--conversations", "2", "--turns", "2", "--max-tokens", "4"]) == 0
    out = capsys.readouterr().out
    assert "offload config: " in out and "kvoffload/examples/cpu.yaml" in out and "1 torch thread(s)" in out
    assert "outputs identical to the run without offload: yes" in out
    # The demo's model is one whose prefill costs more than a load, and the header says so.
    assert "model=small," in out and "the trade-off a real model has on a GPU server" in out


def test_run_on_the_tiny_model_says_its_timings_show_offloads_fixed_costs(capsys):
    assert main(["run", "--model", "tiny", "--conversations", "2", "--turns", "2", "--max-tokens", "4"]) == 0
    assert "tiny is a test model whose prefill is nearly free" in capsys.readouterr().out


def test_swap_without_an_offload_tier_is_refused(capsys):
    assert main(["run", "--no-offload", "--preemption-mode", "swap"]) == 2
    assert "--preemption-mode swap saves preempted requests' KV to an offload tier" in capsys.readouterr().err


def test_config_check_accepts_an_example_name(capsys):
    assert main(["config", "check", "research_arc"]) == 0
    assert "policy arc" in capsys.readouterr().out


def test_a_policy_module_in_the_current_directory_resolves_from_the_console_script(tmp_path):
    (tmp_path / "mypolicies.py").write_text(textwrap.dedent("""
        from kvoffload.offload.lru import LRUCachePolicy

        class MRUCachePolicy(LRUCachePolicy):
            pass
    """))
    (tmp_path / "tiers.yaml").write_text("tiers: [{medium: cpu, capacity: 1MiB, eviction_policy: 'mypolicies:MRUCachePolicy'}]\n")
    script = "import sys; from kvoffload.cli import main; sys.exit(main(['config', 'check', 'tiers.yaml']))"
    # -I: isolated, like a console script (the current directory is not on sys.path).
    proc = subprocess.run([sys.executable, "-I", "-c", script], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "mypolicies:MRUCachePolicy" in proc.stdout


def test_first_day_mistakes_are_named_before_any_run(capsys):
    """#84 item 8: a misspelt model lists the built-in ones, a missing config the packaged
    examples, and a metrics port in use is said before the ~20 s baseline run, not after."""
    import socket
    import time

    from kvoffload.cli import main

    assert main(["run", "--model", "tinyy"]) == 2
    assert "built-in model (tiny, small, tiny-hybrid)" in capsys.readouterr().err
    assert main(["run", "--config", "nope.yaml"]) == 2
    assert "a packaged example by name (cpu, cpu_disk," in capsys.readouterr().err
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        t0 = time.monotonic()
        assert main(["run", "--model", "tiny", "--prometheus-port", str(busy.getsockname()[1])]) == 2
        took = time.monotonic() - t0
    err = capsys.readouterr()
    assert "cannot listen on" in err.err and "pick a free port" in err.err
    assert "no offload" not in err.out and took < 30  # refused before the baseline ran
