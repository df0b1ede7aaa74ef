"""The smoke gate can fail: a broken FP8 path (activation scales applied to the wrong
rows) makes the smoke fail and --rewrite refuse to write a golden."""

import json

import torch

import smoke.model as MD
import smoke.run as SR


def _roll_scale_rows(real):
    def broken(x, group_size=128, arch=None, backend=None):
        q, s = real(x, group_size, arch=arch, backend=backend)
        return q, torch.roll(s, 1, dims=0)  # each token gets its neighbour's scales

    return broken


def test_healthy_task_passes_and_rewrites(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(SR, "GOLDENS", tmp_path)
    assert SR.main(["--task", "tp4_reference", "--arch", "sm100", "--rewrite"]) == 0
    golden = json.loads((tmp_path / "sm100" / "tp4_reference.json").read_text())
    assert golden["tokens"] and golden["logits_summary"]["top1_margin_min"] > 1
    assert SR.main(["--task", "tp4_reference", "--arch", "sm100"]) == 0
    assert "PASS" in capsys.readouterr().out


def test_broken_fp8_path_fails_and_rewrite_refuses(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(SR, "GOLDENS", tmp_path)
    monkeypatch.setattr(MD, "quantize_activation", _roll_scale_rows(MD.quantize_activation))
    assert SR.main(["--task", "tp4_reference", "--arch", "sm90", "--rewrite"]) == 1
    out = capsys.readouterr().out
    assert "refusing to rewrite the golden" in out and "FAIL" in out
    assert not (tmp_path / "sm90" / "tp4_reference.json").exists()
    assert SR.main(["--task", "tp4_reference", "--arch", "sm90"]) == 1


def test_golden_mismatch_fails(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(SR, "GOLDENS", tmp_path)
    assert SR.main(["--task", "tp4_reference", "--arch", "cpu", "--rewrite"]) == 0
    path = tmp_path / "cpu" / "tp4_reference.json"
    g = json.loads(path.read_text())
    g["tokens"][0] += 1
    path.write_text(json.dumps(g))
    assert SR.main(["--task", "tp4_reference", "--arch", "cpu"]) == 1
    assert "golden" in capsys.readouterr().out


def test_model_dir_of_another_architecture_is_refused(tmp_path, capsys):
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(1)}, str(tmp_path / "m.safetensors"))
    (tmp_path / "config.json").write_text('{"architecture": "llama"}')
    assert SR.main(["--model-dir", str(tmp_path)]) == 2


# ----------------------------------------------------------------------------- mutations

import pytest  # noqa: E402

from smoke import mutations as MU  # noqa: E402


@pytest.fixture(scope="module")
def checkpoint():
    from rtp_fp8.loader.online_fp8 import load_safetensors

    cfg, tensors = load_safetensors(MD.ensure_default_checkpoint())
    # dense_moe_tp1 (TP 1: every weight square-able for the block transposition) on the float64
    # reference GEMM: the same FP8 operands as the Triton path, minutes faster under the interpreter
    # reference GEMM: the same FP8 operands as the Triton path, minutes faster under the interpreter;
    # 3 greedy steps: the gate's per-linear probe runs over prompt + generated tokens either way
    task = SR.load_tasks("dense_moe_tp1")[0]
    return cfg, tensors, dict(task, backend="reference", steps=3, criteria=dict(task["criteria"], tokens_equal_steps=3))


@pytest.mark.parametrize("arch", ["cpu", "sm90", "sm100", "sm120"])
def test_real_fp8_passes_the_gate_on_every_format(checkpoint, arch):
    cfg, tensors, task = checkpoint
    r = SR.run_task(task, SR.ARCHS[arch], cfg, tensors, "cpu")
    assert r["gate"], r
    assert len(r["linear_errors"]) == 23  # every linear and every expert was probed
    assert r["worst_rel_l2"] <= SR.MAX_LINEAR_REL_L2


@pytest.mark.parametrize("arch", ["sm90", "sm100"], ids=["fp32", "ue8m0"])
@pytest.mark.parametrize("mutation", list(MU.MUTATIONS))
def test_every_mutation_fails_the_gate(checkpoint, monkeypatch, mutation, arch):
    """Each broken FP8 path fails the gate on both scale formats, though the greedy tokens agree
    with BF16 for all of them (docs/smoke_gate.md): the per-linear check is what catches them."""
    cfg, tensors, task = checkpoint
    monkeypatch.setattr(SR.MD, "Fp8Linears", MU.mutated(mutation))
    r = SR.run_task(task, SR.ARCHS[arch], cfg, tensors, "cpu")
    assert not r["gate"]
    assert r["worst_rel_l2"] > 1.5 * SR.MAX_LINEAR_REL_L2, (r["worst_linear"], r["worst_rel_l2"])


def test_missing_golden_fails(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(SR, "GOLDENS", tmp_path)
    assert SR.main(["--task", "tp4_reference", "--arch", "cpu"]) == 1
    assert "no golden" in capsys.readouterr().out


@pytest.mark.parametrize("args,msg", [
    (["--task", "nope"], "--task 'nope': no such task"),
    (["--model-dir", "/nonexistent/dir"], "--model-dir /nonexistent/dir: not a directory"),
    (["--arch", "sm99"], "invalid choice: 'sm99'"),
])
def test_cli_bad_arguments_print_one_line(args, msg, capsys):
    with pytest.raises(SystemExit) if "--arch" in args else _nothing():
        rc = SR.main(args)
        assert rc == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_truncated_and_incomplete_checkpoints_are_named(tmp_path, capsys):
    src = MD.ensure_default_checkpoint()
    (tmp_path / "config.json").write_text((src / "config.json").read_text())
    (tmp_path / "model.safetensors").write_bytes((src / "model.safetensors").read_bytes()[:100000])
    assert SR.main(["--model-dir", str(tmp_path)]) == 2
    assert f"{tmp_path / 'model.safetensors'}: not a readable safetensors file" in capsys.readouterr().err
    from safetensors.torch import load_file, save_file

    part = {k: v for k, v in load_file(str(src / "model.safetensors")).items() if k != "layers.1.wo"}
    save_file(part, str(tmp_path / "model.safetensors"))
    assert SR.main(["--model-dir", str(tmp_path)]) == 2
    assert "checkpoint lacks 1 tensors of this architecture, e.g. ['layers.1.wo']" in capsys.readouterr().err
    (tmp_path / "config.json").write_text("{not json")
    assert SR.main(["--model-dir", str(tmp_path)]) == 2
    assert f"{tmp_path / 'config.json'}: not valid JSON" in capsys.readouterr().err
