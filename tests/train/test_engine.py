"""The engine: schedule, accumulation, checkpoints, exact resume after a kill, non-finite loss, devices."""

import json
import math

import pytest
import torch

from posbench.data.batch import IGNORE_INDEX, Batch, masked_cross_entropy
from posbench.runs import runner
from posbench.runs.config import resolve_run_config
from posbench.train import NonFiniteLossError, StopTraining, TrainConfig, distributed, train
from posbench.train.checkpoint import (CheckpointError, checkpoint_path, load_train_state, load_weights,
                                       save_checkpoint)
from posbench.train.device import DeviceError, pick_device, resolve_compile
from posbench.train.optim import lr_lambda, make_optimizer
from posbench.train.seeds import seed_everything
from posbench.model import Transformer
from posbench.tasks import TASKS

from encoding_helpers import one_thread  # noqa: F401 (a fixture)


pytestmark = pytest.mark.usefixtures("one_thread")   # tiny models gain nothing from threads


def tiny(encoding="tape", *sets):
    cfg = resolve_run_config("arithmetic", encoding, "tiny", sets=list(sets))
    task = TASKS["arithmetic"](cfg)
    return cfg, task


def build(task, seed=0):
    seed_everything(seed)
    return Transformer(task.model_config())


def weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_warmup_then_linear_decay():
    f = lr_lambda(TrainConfig(steps=10, warmup_steps=2, min_lr_ratio=0.0))
    assert [round(f(s), 4) for s in range(10)] == [0.5, 1.0, 1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125]
    g = lr_lambda(TrainConfig(steps=100, warmup_ratio=0.1, min_lr_ratio=0.1))
    assert g(9) == 1.0 and g(10) == 1.0 and g(100) == pytest.approx(0.1)


def test_train_config_checks():
    with pytest.raises(ValueError, match="multiple"):
        TrainConfig(batch_size=10, grad_accum=3)
    with pytest.raises(ValueError, match="precision"):
        TrainConfig(precision="fp8")


class FixedStream:
    """The same 8 sequences every step; ``next_batch(b)`` hands them out b at a time."""

    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(0, 18, (8, 12), generator=g)
        self.targets = torch.randint(0, 18, (8, 12), generator=g)
        self.targets[:, :5] = IGNORE_INDEX
        self.targets[:3, 9:] = IGNORE_INDEX      # unequal token counts per sequence
        self.pos = 0

    def next_batch(self, b):
        rows = slice(self.pos, self.pos + b)
        self.pos = (self.pos + b) % 8
        return Batch(self.tokens[rows], self.targets[rows])

    def state_dict(self):
        return {"pos": self.pos}

    def load_state_dict(self, s):
        self.pos = s["pos"]


def test_gradient_accumulation_matches_one_big_batch():
    _, task = tiny("rope")
    results = []
    for accum in (1, 2, 4):
        model = build(task)
        cfg = TrainConfig(steps=3, batch_size=8, grad_accum=accum, lr=1e-3, warmup_steps=0)
        train(model, FixedStream(), cfg)
        results.append(weights(model))
    for other in results[1:]:
        for k in results[0]:
            torch.testing.assert_close(other[k], results[0][k], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("encoding", ["tape", "randpe"])
def test_resume_after_kill_gives_bitwise_equal_weights(tmp_path, encoding):
    # tape draws a random position offset (Python's RNG) and randpe random positions (torch's RNG) each
    # step, so this also checks that RNG states are saved and restored; grad_accum 2 exercises the stream
    cfg, task = tiny(encoding, "steps=9", "checkpoint_every=3", "grad_accum=2", "batch_size=8")
    train_cfg = TrainConfig(**cfg.train)

    full = build(task)
    train(full, task.train_stream(), train_cfg, checkpoint_dir=tmp_path / "full")

    def kill_at_5(step, model, loss):
        if step == 5:
            raise StopTraining

    killed = build(task)
    with pytest.raises(StopTraining):
        train(killed, task.train_stream(), train_cfg, checkpoint_dir=tmp_path / "run", callbacks=[kill_at_5])
    state = json.loads((tmp_path / "run" / "train_state.json").read_text())
    assert state["step"] == 3                                   # the last checkpoint before the kill
    seed_everything(123)                                 # a new process: different RNG, fresh model
    resumed = build(task, seed=99)
    result = train(resumed, task.train_stream(), train_cfg, checkpoint_dir=tmp_path / "run", resume=True)
    assert result.steps == 9 and result.resumed_from == [3]
    a, b = weights(full), weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a), "resumed weights differ from the uninterrupted run"
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["model.safetensors", "model_config.json",
                                                                   "optimizer.safetensors", "train_state.json"]
    assert not (tmp_path / "run.tmp").exists() and not (tmp_path / "run.old").exists()


def test_resume_of_a_killed_cli_run_in_place(tmp_path):
    """The runner-level path ``posbench run --resume DIR`` uses: config.json + checkpoint -> same weights."""
    cfg, _ = tiny("rope", "steps=8", "checkpoint_every=4")
    full = runner.execute(cfg, tmp_path / "a", reporter=None)

    def kill(step, model, loss):
        if step == 6:
            raise StopTraining

    with pytest.raises(StopTraining):
        runner.execute(cfg, tmp_path / "b", callbacks=(kill,))
    run_dir = next((tmp_path / "b" / "arithmetic" / "rope").iterdir())
    assert not (run_dir / "result.json").exists() and (run_dir / "config.json").exists()
    done = runner.resume(run_dir)
    assert done.run_dir == run_dir and done.record.to_dict()["training"]["resumed_from"] == [4]
    from safetensors.torch import load_file

    wa = load_file(str(full.run_dir / "checkpoint" / "model.safetensors"))
    wb = load_file(str(run_dir / "checkpoint" / "model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert done.record.to_dict()["metrics"] == full.record.to_dict()["metrics"]


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
    cfg, task = tiny("rope", "steps=10", "checkpoint_every=3")
    model = build(task)

    def poison(step, model, loss):
        if step == 4:
            with torch.no_grad():
                model.lm_head.weight.fill_(float("nan"))

    with pytest.raises(NonFiniteLossError) as err:
        train(model, task.train_stream(), TrainConfig(**cfg.train), checkpoint_dir=tmp_path / "ck",
                     callbacks=[poison])
    message = str(err.value)
    assert "\n" not in message and "step 5" in message and "last good checkpoint: step 3" in message
    state = json.loads((tmp_path / "ck" / "train_state.json").read_text())
    assert state["step"] == 3
    fresh = build(task)
    load_weights(fresh, tmp_path / "ck")
    assert all(torch.isfinite(p).all() for p in fresh.parameters())


def test_non_finite_loss_without_checkpoint(tmp_path):
    cfg, task = tiny("rope", "steps=3")
    model = build(task)
    with torch.no_grad():
        model.embed.weight[5] = float("inf")
    with pytest.raises(NonFiniteLossError, match="step 1; .*no checkpoint"):
        train(model, task.train_stream(), TrainConfig(**cfg.train))


def test_checkpoint_swap_survives_a_kill_mid_swap(tmp_path):
    _, task = tiny("rope")
    model = build(task)
    ck = tmp_path / "checkpoint"
    save_checkpoint(ck, model, {"step": 1})
    ck.rename(tmp_path / "checkpoint.old")                  # killed between the two renames
    assert checkpoint_path(ck) == tmp_path / "checkpoint.old"
    with pytest.raises(CheckpointError):
        load_train_state(tmp_path / "nothing")
    config = json.loads((tmp_path / "checkpoint.old" / "model_config.json").read_text())
    assert config["encoding"] == "rope"


def test_device_selection():
    assert pick_device("cpu").type == "cpu"
    assert pick_device("auto").type in {"cpu", "cuda", "mps"}
    with pytest.raises(DeviceError):
        pick_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError, match="CUDA is not available"):
            pick_device("cuda")


def test_seeds_are_recorded_and_reproducible():
    s = seed_everything(7)
    a = torch.rand(3)
    seed_everything(7)
    assert torch.equal(a, torch.rand(3)) and s["torch"] == 7


def test_train_result_bookkeeping():
    cfg, task = tiny("nope", "steps=4")
    model = build(task)
    result = train(model, task.train_stream(), TrainConfig(**cfg.train))
    assert result.steps == 4 and result.tokens == 4 * 32 * 9 and result.target_tokens > 0
    assert math.isfinite(result.final_loss) and result.loss_history[-1][0] == 4
    assert result.tokens_per_s > 0 and not model.training


class PoisonAt:
    """The task's loss, made NaN from optimizer step ``step`` on (no callback needed to poison)."""

    def __init__(self, step, micro_batches=1):
        self.step, self.micro_batches, self.calls = step, micro_batches, 0

    def __call__(self, model, batch):
        self.calls += 1
        loss, n = masked_cross_entropy(model, batch)
        if (self.calls - 1) // self.micro_batches + 1 >= self.step:
            loss = loss * float("nan")
        return loss, n


@pytest.mark.parametrize("checkpoint_every,last_good", [(4, 4), (6, 0)])
def test_non_finite_loss_is_caught_by_the_next_log_step_or_checkpoint(tmp_path, checkpoint_every, last_good):
    # the loss stays on the device between log steps; a NaN at step 5 is caught at the next log step (8) or at
    # the checkpoint due at step 6, before it is written: the last good checkpoint is never overwritten
    cfg, task = tiny("rope", "steps=10", f"checkpoint_every={checkpoint_every}", "log_every=8")
    model = build(task)
    with pytest.raises(NonFiniteLossError, match="at step 5;") as err:
        train(model, task.train_stream(), TrainConfig(**cfg.train), checkpoint_dir=tmp_path / "ck",
                     loss_fn=PoisonAt(5))
    if last_good:
        assert json.loads((tmp_path / "ck" / "train_state.json").read_text())["step"] == last_good
        assert f"last good checkpoint: step {last_good}" in str(err.value)
    else:
        assert not (tmp_path / "ck").exists() and "no checkpoint was written" in str(err.value)


def test_losses_are_read_only_at_log_steps(monkeypatch):
    reads = []
    real = distributed.all_reduce_sum

    def spy(tensor):
        reads.append(tensor.shape[-1] if tensor.dim() == 2 else None)
        return real(tensor)
    monkeypatch.setattr(distributed, "all_reduce_sum", spy)
    cfg, task = tiny("rope", "steps=10", "log_every=4")
    result = train(build(task), task.train_stream(), TrainConfig(**cfg.train))
    assert reads == [4, 4, 2]                 # steps 1-4, 5-8, 9-10: one read each, nothing in between
    assert [s for s, _ in result.loss_history] == list(range(1, 11)) and math.isfinite(result.final_loss)


def test_compile_setting_resolves_per_device_and_is_recorded(tmp_path):
    assert resolve_compile("auto", torch.device("cpu")) is False
    assert resolve_compile("auto", torch.device("cuda")) is True
    assert TrainConfig(compile="on").compile is True and TrainConfig(compile="False").compile is False
    assert TrainConfig(compile=True).compile is True and TrainConfig().compile == "auto"
    with pytest.raises(ValueError, match="expected true, false or auto"):
        TrainConfig(compile="maybe")
    cfg, _ = tiny("rope", "steps=2")
    assert cfg.train["compile"] == "auto"
    outcome = runner.execute(cfg, tmp_path)
    assert outcome.record.to_dict()["config"]["train"]["compile"] == "auto"
    assert outcome.record.to_dict()["training"]["compile"] is False             # resolved: off on a CPU
    assert outcome.record.to_dict()["training"]["fused_optimizer"] is False
    assert outcome.record.to_dict()["training"]["parallel"] == {"mode": "none", "backend": None, "world_size": 1,
                                                      "global_batch": 32, "micro_batch_per_rank": 32,
                                                      "grad_accum_per_rank": 1, "data_sharding": "none"}


def test_optimizer_is_fused_only_for_plain_cuda_parameters():
    _, task = tiny("rope")
    model = build(task)
    optimizer = make_optimizer(model, TrainConfig())
    assert not optimizer.defaults.get("fused")
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    assert {id(p) for g in optimizer.param_groups for p in g["params"]} == trainable


def test_batch_counts_targets_on_the_host():
    tokens = torch.zeros(2, 4, dtype=torch.long)
    targets = torch.tensor([[1, IGNORE_INDEX, 2, 3], [IGNORE_INDEX] * 4])
    moved = Batch(tokens, targets).to("cpu")
    assert moved.target_count == 3 and moved.n_targets == 3


@pytest.mark.gpu
def test_training_steps_do_not_synchronise_the_gpu():
    """Between log steps nothing in the step waits for the GPU (CUDA sync debug mode turns a sync into an
    error); the engine alone is tested, with a model that has no syncs of its own."""

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.head = torch.nn.Embedding(18, 32), torch.nn.Linear(32, 18)

        def forward(self, tokens, positions=None):
            return self.head(self.embed(tokens).relu())

    cfg, task = tiny("rope", "steps=6", "log_every=6")
    stream, checked = task.train_stream(), []

    class Checked:
        def next_batch(self, b):
            return stream.next_batch(b)

        def state_dict(self):
            return stream.state_dict()

        def load_state_dict(self, s):
            stream.load_state_dict(s)

    def loss_fn(model, batch):
        torch.cuda.set_sync_debug_mode("error" if 1 < len(checked) < 5 else "default")
        checked.append(1)
        return masked_cross_entropy(model, batch)

    try:
        result = train(Tiny(), Checked(), TrainConfig(**cfg.train), device="cuda", loss_fn=loss_fn)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert result.steps == 6 and result.fused_optimizer and math.isfinite(result.final_loss)
    assert result.compile is True
