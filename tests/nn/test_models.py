"""rtp_fp8.nn on models from a library people use: tiny Llama-style and BERT-style transformers
models built from config (random weights, no download), converted with one call, compared with
the BF16 model on each arch's scale format, and saved / reloaded in the published FP8 format.

    PYTHONPATH=. TRITON_INTERPRET=1 python tests/nn/test_models.py   # the table in docs/models.md
"""

import json
import pathlib
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers (in every toolchain's lock) is not "
                                                          "installed in this Python")

from rtp_fp8 import nn as fp8nn  # noqa: E402
from rtp_fp8.arch import Arch  # noqa: E402

FORMATS = {"sm90 (FP32 scales)": Arch(9, 0), "sm100 (UE8M0)": Arch(10, 0), "sm120 (UE8M0)": Arch(12, 0)}
# Stated bounds, from docs/models.md's measurements with margin: output cosine vs the BF16 model,
# and the worst element relative to the output's RMS.
MIN_COSINE = 0.99
MAX_ERR_OVER_RMS = 0.6


def llama(seed=0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                                   max_position_embeddings=64)
    return transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()


def bert(seed=0):
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                  num_attention_heads=4, vocab_size=512, max_position_embeddings=64)
    return transformers.BertModel(cfg).to(torch.bfloat16).eval()


MODELS = {"llama": (llama, lambda m, ids: m(ids).logits),
          "bert": (bert, lambda m, ids: m(ids).last_hidden_state)}


def compare(kind: str, arch: Arch) -> dict:
    build, out = MODELS[kind]
    ref = build()
    model = build()
    report = fp8nn.quantize_model(model, arch=arch)
    ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, got = out(ref, ids).float(), out(model, ids).float()
    cos = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0).item()
    rms = want.pow(2).mean().sqrt().item()
    err = (got - want).abs().max().item()
    return {"model": kind, "converted": len(report.converted), "kept": sorted(report.skipped), "cosine": cos,
            "max_abs_err": err, "rms": rms, "err_over_rms": err / rms,
            "argmax_agree": (got.argmax(-1) == want.argmax(-1)).float().mean().item()}


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("kind", list(MODELS))
def test_converted_model_tracks_bf16(kind, fmt):
    r = compare(kind, FORMATS[fmt])
    assert r["converted"] == (14 if kind == "llama" else 13)  # bert: 6 per layer and the pooler
    assert r["kept"] == (["lm_head"] if kind == "llama" else [])
    assert r["cosine"] >= MIN_COSINE, r
    assert r["err_over_rms"] <= MAX_ERR_OVER_RMS, r


def test_every_linear_is_an_nn_module_child():
    model = llama()
    fp8nn.quantize_model(model, arch=Arch(9, 0))
    names = {n for n, m in model.named_modules() if isinstance(m, fp8nn.FP8Linear)}
    assert "model.layers.0.self_attn.q_proj" in names and "model.layers.1.mlp.down_proj" in names
    assert len(model.state_dict()) == len(llama().state_dict()) + 14  # + a weight_scale_inv per FP8 linear


@pytest.mark.parametrize("arch", [Arch(9, 0), Arch(10, 0)], ids=["sm90", "sm100"])
def test_published_format_round_trip_through_safetensors(tmp_path, arch):
    model = llama()
    fp8nn.quantize_model(model, arch=arch)
    fp8nn.save_checkpoint(model, tmp_path, config=model.config.to_dict())
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["quantization_config"]["weight_block_size"] == [128, 128]
    fresh = llama(seed=123)  # other random weights: everything must come from the file
    report = fp8nn.load_checkpoint(fresh, tmp_path, arch=arch)
    assert len(report.converted) == 14 and report.skipped == {"lm_head": "high precision in an FP8 checkpoint"}
    for name, t in model.state_dict().items():
        got = fresh.state_dict()[name]
        assert got.dtype == t.dtype and torch.equal(got.view(torch.uint8), t.view(torch.uint8)), name
    ids = torch.randint(0, 512, (1, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(fresh(ids).logits, model(ids).logits)


def test_transformers_reads_the_config_we_write(tmp_path):
    """The config.json round-trips through transformers' own config class, quantization_config included."""
    model = llama()
    fp8nn.quantize_model(model, arch=Arch(9, 0))
    fp8nn.save_checkpoint(model, tmp_path, config=model.config.to_dict())
    cfg = transformers.AutoConfig.from_pretrained(str(tmp_path))
    qc = cfg.quantization_config if isinstance(cfg.quantization_config, dict) else cfg.quantization_config.to_dict()
    assert qc["quant_method"] == "fp8" and list(qc["weight_block_size"]) == [128, 128]
    assert qc["modules_to_not_convert"] == ["lm_head"]


def test_readme_example_runs(tmp_path, monkeypatch):
    """README's "Use it on your model" block, as it is."""
    text = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = text.split("## Use it on your model", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert len(code.strip().splitlines()) <= 14
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {})
    assert (tmp_path / "llama-fp8" / "model.safetensors").is_file()


def main() -> int:
    print("| model | scale format | FP8 linears | kept | cosine vs BF16 | max abs err | output RMS | "
          "max err / RMS | argmax agree |")
    print("|---|---|---|---|---|---|---|---|---|")
    for kind in MODELS:
        for fmt, arch in FORMATS.items():
            r = compare(kind, arch)
            print(f"| {kind} | {fmt} | {r['converted']} | {', '.join(r['kept']) or '-'} | {r['cosine']:.5f} | "
                  f"{r['max_abs_err']:.4f} | {r['rms']:.3f} | {r['err_over_rms']:.3f} | {r['argmax_agree']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
