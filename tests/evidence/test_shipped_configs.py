"""The DeepSpeed configs LLaMA-Factory and ms-swift ship (tests/data/ds-configs/, sources in its README):
``zeroplanner check`` gives no false error and misses none, for each client that runs them, and its key tables agree
with DeepSpeed's own config classes (and, for the HF Trainer, transformers' fill). The engine tests show the
client-optimizer rule on real DeepSpeed / accelerate runs on one CPU rank (gloo).

Expected verdicts (DeepSpeed 0.19.8, transformers 5.24.0, accelerate 1.15.0; tests/data/ds-configs/README.md):
- under the HF Trainer every file runs except lf_z3_alst.json, whose bf16 block carries fp16's loss-scaling keys
  (DeepSpeedBF16Config: extra_forbidden);
- under deepspeed.initialize every file errors: all have "auto" batch keys (DeepSpeedConfig's batch arithmetic
  raises TypeError on the string), and the four LLaMA-Factory offload files without an optimizer block also hit
  ZeRO-Offload's client-optimizer check (engine.py _configure_optimizer raises ZeRORuntimeException).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from zeroplanner.deepspeed import from_deepspeed_config, load_config_text
from zeroplanner.deepspeed.lint import lint
from zeroplanner.pitfalls import config_checked
from zeroplanner.scenarios import default_scenario

from tests.helpers import DS_CONFIGS

ROOT = Path(__file__).resolve().parents[2]

CONFIGS_DIR = DS_CONFIGS
NAMES = sorted(p.name for p in CONFIGS_DIR.glob("*.json"))
OFFLOAD_WITHOUT_OPTIMIZER = {"lf_z2_offload.json", "lf_z3_fp8.json", "lf_z3_offload.json", "lf_z3_partial.json"}

EXPECTED_ERRORS = {
    "hf_trainer": {name: set() for name in NAMES} | {"lf_z3_alst.json": {"unknown_key"}},
    "deepspeed": {name: {"auto_outside_hf"} | ({"offload_client_optimizer"} if name in OFFLOAD_WITHOUT_OPTIMIZER
                                               else set()) for name in NAMES}
    | {"lf_z3_alst.json": {"auto_outside_hf", "unknown_key"}},
}


def test_all_nine_shipped_configs_are_covered():
    assert len(NAMES) == 9 and set(EXPECTED_ERRORS["deepspeed"]) == set(NAMES)


def _table_findings(name: str, mode: str):
    config, read = load_config_text((CONFIGS_DIR / name).read_bytes(), mode)
    scenario, parsed = from_deepspeed_config(config, base=default_scenario(), mode=mode)
    return config, scenario, read + lint(config, scenario, mode) + parsed


@pytest.mark.parametrize("mode", ["hf_trainer", "deepspeed"])
@pytest.mark.parametrize("name", NAMES)
def test_shipped_config_errors_are_exactly_the_real_ones(name, mode):
    _, _, findings = _table_findings(name, mode)
    assert {f.rule for f in findings if f.severity == "error"} == EXPECTED_ERRORS[mode][name]


@pytest.mark.parametrize("mode", ["hf_trainer", "deepspeed"])
@pytest.mark.parametrize("name", NAMES)
def test_key_tables_agree_with_deepspeeds_config_classes(name, mode):
    """The hand-written tables (the fallback without DeepSpeed) find a config-level error exactly when the
    libraries' own validation does, on the same keys."""
    pytest.importorskip("deepspeed")
    pytest.importorskip("transformers")
    from zeroplanner.deepspeed.library import library_findings

    config, scenario, findings = _table_findings(name, mode)
    library = library_findings(config, scenario, mode)
    assert library is not None
    table_config_errors = [f for f in findings if config_checked(f)]
    assert bool(library) == bool(table_config_errors), (library, table_config_errors)
    keyed = {f.key for f in library if f.key}
    assert keyed <= {f.key for f in table_config_errors}
    if mode == "hf_trainer" and name == "lf_z3_alst.json":
        assert keyed == {f"bf16.{k}" for k in ("auto_cast", "loss_scale", "initial_scale_power",
                                                 "loss_scale_window", "hysteresis", "min_loss_scale")}


def test_autotp_read_as_data_parallel_world_over_tp():
    """lf_z2_autotp.json: tensor_parallel.autotp_size 2 on 8 GPUs -> data-parallel degree 4, TP 2 (issue 13);
    DeepSpeed's engine reads autotp_size (engine.py autotp_size, _configure_tensor_parallel)."""
    _, s, findings = _table_findings("lf_z2_autotp.json", "hf_trainer")
    assert (s.cluster.tensor_parallel_size, s.cluster.data_parallel_degree) == (2, 4)
    assert any(f.rule == "tensor_parallel" for f in findings)
    _, s1, _ = _table_findings("swift_zero2_autotp.json", "hf_trainer")  # autotp_size 1: AutoTP off
    assert s1.cluster.tensor_parallel_size == 1


def test_sequence_parallel_block_is_read_and_priced_not_called_unread():
    """lf_z3_alst.json's sequence_parallel block (size 4, ulysses.degree 4, tiling on; LLaMA-Factory alst_config.py)
    is priced: Ulysses degree 4 on 8 GPUs, tiled MLP and loss (issue 13); no unknown-key finding for it."""
    _, s, findings = _table_findings("lf_z3_alst.json", "hf_trainer")
    assert not [f for f in findings if f.key == "sequence_parallel" and f.rule == "unknown_key"]
    assert (s.cluster.sequence_parallel_size, s.training.tiled_mlp, s.training.tiled_loss) == (4, True, True)
    assert not [f for f in findings if f.rule == "sequence_parallel_unpriced"]


def test_stage3_auto_fill_agrees_with_itself():
    """transformers trainer_config_finalize fills both stage-3 keys at ZeRO-3 (if self.is_zero3()): check lists
    them as filled and prices the filled values (hidden 4096: int(0.9 * 4096**2), 10 * 4096), never 'not filled'."""
    _, s, findings = _table_findings("swift_zero3.json", "hf_trainer")
    assert (s.zero.stage3_prefetch_bucket_size, s.zero.stage3_param_persistence_threshold) == (15099494, 40960)
    texts = [f.message for f in findings if "stage3_prefetch_bucket_size" in f.key + f.message]
    assert texts and not any("not filled" in t for t in texts)


@pytest.mark.parametrize("name", NAMES)
def test_cli_check_hf_trainer_on_shipped_configs(cli_main, capsys, name):
    code = cli_main(["check", str(CONFIGS_DIR / name), "--hf-trainer", "--json"])
    obj = json.loads(capsys.readouterr().out)
    assert code == (1 if name == "lf_z3_alst.json" else 0)
    assert obj["priced"]["model_from"] == "default" and obj["priced"]["model"] == "llama-2-7b"
    assert any(f["rule"] == "assumed_model" for f in obj["findings"])


# ----------------------------------------------------------------------------------------------------------------
# Real runs on one CPU rank: the client decides whether ZeRO-Offload without an optimizer block starts. Each run
# is its own process, forked from one that imported the libraries (engine_jobs).
# ----------------------------------------------------------------------------------------------------------------
JOB = r"""
import dataclasses, json, sys, types
import torch


def job(config_path, client, optimizer, fill):
    config = json.load(open(config_path))
    from transformers import TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig
    if fill:
        # the HF Trainer's own fill with TrainingArguments' defaults (per-device batch 1, accumulation 1, 1 rank)
        d = {f.name: f.default for f in dataclasses.fields(TrainingArguments)}
        args = types.SimpleNamespace(**{k: d[k] for k in ("learning_rate", "adam_beta1", "adam_beta2",
                                       "adam_epsilon", "weight_decay", "max_grad_norm", "save_on_each_node",
                                       "fp16_full_eval", "bf16_full_eval")})
        args.world_size, args.per_device_train_batch_size, args.gradient_accumulation_steps = 1, 1, 1
        args.bf16 = args.fp16 = False
        if isinstance(config.get("gradient_clipping"), (int, float)):  # lf_z3_fp8: the user's max_grad_norm agrees
            args.max_grad_norm = config["gradient_clipping"]
        args.get_warmup_steps = lambda n: 0
        hf = HfTrainerDeepSpeedConfig(config)
        hf.trainer_config_process(args)
        hf.trainer_config_finalize(args, types.SimpleNamespace(config=types.SimpleNamespace(hidden_size=8)), 10)
        config = hf.config
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    opt = {"torch_adamw": lambda: torch.optim.AdamW(model.parameters(), lr=1e-3),
           "torch_sgd": lambda: torch.optim.SGD(model.parameters(), lr=1e-3)}.get(optimizer, lambda: None)()
    try:
        if client == "hf_trainer":  # accelerate, as the Trainer prepares model and optimizer
            from accelerate import Accelerator
            from accelerate.utils import DeepSpeedPlugin
            acc = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config))
            model, opt = acc.prepare(model, opt)
            zero_opt = opt.optimizer
        else:
            import deepspeed
            deepspeed.init_distributed(dist_backend="gloo")
            _, zero_opt, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                     optimizer=opt, config=config)
        return {"ok": True, "optimizer": type(getattr(zero_opt, "optimizer", zero_opt)).__name__,
                "wrapper": type(zero_opt).__name__,
                "partitioned": any(hasattr(p, "ds_id") for p in model.parameters())}
    except Exception as exc:
        return {"ok": False, "error": type(exc).__name__, "message": str(exc)[:300]}
"""

JOB_TIMEOUT_SECONDS = 300
"""A job's limit (SIGALRM in its child), as each run had with its own process before (``subprocess.run``)."""
SERVER_TIMEOUT_SECONDS = 900
"""The job server's whole life (SIGALRM): the module's eleven runs take ~18 s, so a hung server ends, and the
fixture's reads end with it, long before the module's time limit."""
SERVER_EXIT_WAIT_SECONDS = 30
"""How long teardown waits for the server to leave once its stdin is closed, before it kills the process group."""

SERVER = JOB + r"""
import os, signal, threading, traceback
signal.alarm(int(sys.argv[1]))
import accelerate, deepspeed, transformers  # imported once; every job forks from here
from accelerate import Accelerator
from transformers import TrainingArguments
from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig
from deepspeed.ops.adam import DeepSpeedCPUAdam  # noqa: F401
from deepspeed.runtime.zero.muon.muon_optimizer import MuonWithAuxAdam  # noqa: F401 (imports torch.compile, ~2 s)
from zeroplanner.calibrate._worker import cache_cpu_info
cache_cpu_info()  # py-cpuinfo runs a subprocess, ~1.2 s, each time an op loads: once here for every job
import cpuinfo
cpuinfo.get_cpu_info()
# fork copies only the forking thread: a thread the imports started would be missing in every child
assert threading.active_count() == 1, threading.enumerate()
print("READY", flush=True)
for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:  # one job per child: a fresh process with the libraries loaded, gone when the job ends
        fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.environ.update(request["env"])
        signal.alarm(int(request["timeout_seconds"]))
        status = 1
        try:
            print("RESULT " + json.dumps(job(*request["args"])), flush=True)
            status = 0
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    print(f"DONE {status}", flush=True)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _next_line(proc, word: str) -> str:
    """The server's next stdout line that starts with ``word`` (DeepSpeed's logger also writes to stdout on import);
    "" when the server has exited."""
    for line in proc.stdout:
        if line.startswith(word):
            return line
    return ""


@pytest.fixture(scope="module")
def engine_jobs(tmp_path_factory):
    """A process that imports torch, transformers, accelerate and DeepSpeed once and forks one child per job: each
    engine run below is a fresh process (one CPU rank, gloo) without paying again ~4 s of imports, ~2 s of
    the engine's lazy import of torch.compile (zero.utils.is_zero_supported_optimizer imports the Muon optimizer)
    and ~3.6 s of py-cpuinfo (three calls when DeepSpeedCPUAdam loads); 111 s for this module before, 18 s after.
    Yields ``run(config, client, optimizer, fill)``."""
    pytest.importorskip("deepspeed")
    pytest.importorskip("accelerate")
    tmp = tmp_path_factory.mktemp("shipped-engine")
    (tmp / "server.py").write_text(SERVER)
    server_log = open(tmp / "server.log", "w")
    proc = subprocess.Popen([sys.executable, str(tmp / "server.py"), str(SERVER_TIMEOUT_SECONDS)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=server_log, text=True, cwd=tmp,
                            env=dict(os.environ, OMP_NUM_THREADS="1"), start_new_session=True)
    count = 0

    def run(config: dict, client: str, optimizer: str, fill: bool = False) -> dict:
        """One rank; ``fill``: first run the HF Trainer's fill of "auto" (HfTrainerDeepSpeedConfig)."""
        nonlocal count
        count += 1
        cfg, log = tmp / f"cfg{count}.json", tmp / f"job{count}.log"
        cfg.write_text(json.dumps(config))
        env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
        proc.stdin.write(json.dumps({"args": [str(cfg), client, optimizer, fill], "env": env, "log": str(log),
                                     "timeout_seconds": JOB_TIMEOUT_SECONDS}) + "\n")
        proc.stdin.flush()
        done = _next_line(proc, "DONE")
        text = log.read_text() if log.exists() else ""
        lines = [x for x in text.splitlines() if x.startswith("RESULT ")]
        assert done.startswith("DONE") and lines, (done, text[-3000:], (tmp / "server.log").read_text()[-2000:])
        return json.loads(lines[-1][len("RESULT "):])

    try:
        ready = _next_line(proc, "READY")
        assert ready.startswith("READY"), (tmp / "server.log").read_text()[-3000:]
        yield run
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=SERVER_EXIT_WAIT_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the server and a job child it may still wait on
            proc.wait()
        server_log.close()


@pytest.mark.engine
@pytest.mark.parametrize("name", sorted(OFFLOAD_WITHOUT_OPTIMIZER))
def test_offload_without_optimizer_block_runs_under_hf_trainer(engine_jobs, name):
    """accelerate's Accelerator._prepare_deepspeed replaces the Trainer's torch AdamW by DeepSpeedCPUAdam
    (map_pytorch_optim_to_deepspeed): the file starts, so check --hf-trainer reports no error."""
    config = json.loads((CONFIGS_DIR / name).read_text())
    result = engine_jobs(config, "hf_trainer", "torch_adamw", fill=True)
    assert (result["ok"], result["optimizer"]) == (True, "DeepSpeedCPUAdam")
    assert "offload_client_optimizer" not in EXPECTED_ERRORS["hf_trainer"][name]


@pytest.mark.engine
def test_offload_with_client_torch_optimizer_raises_under_deepspeed_alone(engine_jobs):
    """The same file (filled as the Trainer would, so only the optimizer differs) given to deepspeed.initialize
    with a torch optimizer: ZeRORuntimeException (engine.py _configure_optimizer), the error check reports."""
    config = json.loads((CONFIGS_DIR / "lf_z2_offload.json").read_text())
    result = engine_jobs(config, "deepspeed", "torch_adamw", fill=True)
    assert result["ok"] is False and result["error"] == "ZeRORuntimeException"
    assert "offload_client_optimizer" in EXPECTED_ERRORS["deepspeed"]["lf_z2_offload.json"]


@pytest.mark.engine
def test_config_typed_torch_optimizer_with_offload_runs_and_untested_needs_the_flag(engine_jobs):
    """An optimizer block DeepSpeed does not implement (SGD) is built by DeepSpeed from torch.optim and never
    meets the client-optimizer check: it runs with ZeRO-Offload. Without zero_allow_untested_optimizer the
    engine asserts (engine.py _do_optimizer_sanity_check): lint's untested_optimizer error."""
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "SGD", "params": {"lr": 0.01}}, "zero_allow_untested_optimizer": True,
              "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    assert not [f for f in lint(config) if f.severity == "error"]
    result = engine_jobs(config, "deepspeed", "none")
    assert (result["ok"], result["optimizer"]) == (True, "SGD")
    del config["zero_allow_untested_optimizer"]
    assert "untested_optimizer" in {f.rule for f in lint(config) if f.severity == "error"}
    result = engine_jobs(config, "deepspeed", "none")
    assert result["ok"] is False and "untested ZeRO Optimizer" in result["message"]


@pytest.mark.engine
def test_optimizer_param_errors_raise_in_deepspeed_initialize(engine_jobs):
    """Two lint errors DeepSpeed's config classes accept and the engine rejects (deepspeed.initialize, 1 CPU
    rank): max_grad_norm as an optimizer parameter (engine.py _configure_basic_optimizer raises ValueError) and
    "auto" in optimizer.params outside the HF Trainer (the string reaches the torch optimizer)."""
    base = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
            "zero_optimization": {"stage": 1}}
    assert engine_jobs(base, "deepspeed", "none")["ok"] is True
    clip = json.loads(json.dumps(base))
    clip["optimizer"]["params"]["max_grad_norm"] = 1.0
    assert "max_grad_norm_param" in {f.rule for f in lint(clip) if f.severity == "error"}
    result = engine_jobs(clip, "deepspeed", "none")
    assert result["ok"] is False and result["error"] == "ValueError" and "max_grad_norm" in result["message"]
    auto = json.loads(json.dumps(base))
    auto["optimizer"]["params"]["lr"] = "auto"
    assert "auto_outside_hf" in {f.rule for f in lint(auto) if f.severity == "error"}
    assert engine_jobs(auto, "deepspeed", "none")["ok"] is False


@pytest.mark.engine
def test_hf_trainer_offload_turns_a_torch_sgd_into_cpu_adam(engine_jobs):
    """accelerate's map_pytorch_optim_to_deepspeed builds DeepSpeedCPUAdam for a torch SGD too, so check
    --hf-trainer prices Adam's states for --optimizer sgd with offload and no optimizer block (and says so)."""
    from zeroplanner.scenarios import build_scenario

    config = json.loads((CONFIGS_DIR / "lf_z2_offload.json").read_text())
    result = engine_jobs(config, "hf_trainer", "torch_sgd", fill=True)
    assert (result["ok"], result["optimizer"]) == (True, "DeepSpeedCPUAdam")
    s, findings = from_deepspeed_config(config, base=build_scenario(optimizer="sgd"), mode="hf_trainer")
    assert s.training.optimizer == "adam" and any(f.rule == "optimizer_mapped" for f in findings)
    s, _ = from_deepspeed_config(config, base=build_scenario(optimizer="sgd"), mode="deepspeed")
    assert s.training.optimizer == "sgd"


def test_cli_json_stays_json_with_library_check_and_names_the_config_overrides():
    """The real command line in a fresh process (DeepSpeed's logger writes to stdout on import): stdout is one JSON
    object; it says which libraries validated, what it priced and which values came from the file."""
    pytest.importorskip("deepspeed")
    code = "import sys; from zeroplanner import cli; sys.exit(cli.main(sys.argv[1:]))"
    proc = subprocess.run([sys.executable, "-c", code, "check", str(CONFIGS_DIR / "lf_z3_alst.json"), "--hf-trainer",
                           "--json"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    obj = json.loads(proc.stdout)
    assert proc.returncode == 1 and obj["errors"] == 6
    assert [v.split()[0] for v in obj["validated_by"]] == ["transformers", "deepspeed"]
    assert obj["from_config"]["--stage"] == {"config": 3, "command_line": 2}
    assert obj["priced"]["model_from"] == "default"


@pytest.mark.engine
def test_offload_blocks_the_stage_ignores_are_ignored_by_deepspeed(engine_jobs):
    """lint's offload_optimizer_stage0 and offload_param_below_stage3 warnings ("accepted and ignored"), shown on 1-rank
    runs: at stage 0 the engine's optimizer is the bare torch AdamW (no ZeRO optimizer, so nothing to offload);
    at stage 2 with offload_param the parameters are never handed to ZeRO-3's partitioner (no ds_id: only the
    stage-3 optimizer receives offload_param_config, engine.py), unlike stage 3 with the same block."""
    def run(stage, block, **kw):
        config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
                  "zero_optimization": {"stage": stage, block: {"device": "cpu"}}}
        rule = {"offload_optimizer": "offload_optimizer_stage0", "offload_param": "offload_param_below_stage3"}[block]
        return engine_jobs(config, "deepspeed", "none"), rule in {f.rule for f in lint(config)
                                                                       if f.severity == "warning"}

    result, flagged = run(0, "offload_optimizer")
    assert result["ok"] and result["wrapper"] == "AdamW" and flagged
    result, flagged = run(2, "offload_param")
    assert result["ok"] and result["wrapper"] == "DeepSpeedZeroOptimizer" and not result["partitioned"] and flagged
    result, flagged = run(3, "offload_param")
    assert result["ok"] and result["partitioned"] and not flagged


def test_comment_key_is_not_a_spelling_warning():
    _, _, findings = _table_findings("lf_z2_autotp.json", "hf_trainer")
    assert [f.severity for f in findings if f.key == "_comment"] == ["info"]
    assert not [f for f in findings if f.severity == "warning"]
