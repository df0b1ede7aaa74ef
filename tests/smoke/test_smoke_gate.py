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
