#!/usr/bin/env python3
"""Build lily's golden fixtures with Hugging Face transformers (the model's reference implementation).

Runs on the GPU machine (transformers 5.x + torch are installed there; CPU math is enough):
  python3 tools/make_golden.py --out DIR

Writes, under DIR:
  hf/    a tiny random Qwen3_5MoeForConditionalGeneration checkpoint in the official bf16 layout
         (model.language_model.*, fused stacked experts, zero-centred norms, model.visual.* and mtp.*
         present), sharded in two files with model.safetensors.index.json
  mlx/   the same weights converted to the MLX 4-bit affine layout (language_model.model.*, switch_mlp,
         8-bit router and shared_expert_gate, norms stored as 1+w, conv1d [C,K,1], quantization block),
         quantized with MLX's affine rule (docs/model.md §4.2)
  {hf,mlx}/golden/logits_<T>.npy   float32 reference logits [T, vocab] for each prompt length T,
         from transformers in float32 (for mlx: run on the dequantized weights)
  {hf,mlx}/golden/golden.json      prompts, greedy continuations and their top-2 margins

Every weight is random but non-trivial (norm offsets, A_log, dt_bias included), so a wrong formula in
lily shows up as a logit error far above the 1e-4 tolerance.
"""
import argparse
import json
import math
import os
import struct

import numpy as np
import torch

SEED = 1234
PROMPT_LENGTHS = [1, 5, 70, 300]
CONTINUATION_STEPS = 16
GROUP = 64

TEXT_CONFIG = dict(
    model_type="qwen3_5_moe_text",
    vocab_size=512,
    hidden_size=128,
    num_hidden_layers=8,
    layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 2,
    full_attention_interval=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    attn_output_gate=True,
    attention_bias=False,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=32,
    linear_value_head_dim=32,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    num_experts=8,
    num_experts_per_tok=3,
    moe_intermediate_size=64,
    shared_expert_intermediate_size=64,
    hidden_act="silu",
    rms_norm_eps=1e-6,
    max_position_embeddings=4096,
    partial_rotary_factor=0.25,
    rope_parameters=dict(rope_type="default", rope_theta=1000000.0, partial_rotary_factor=0.25,
                         mrope_interleaved=True, mrope_section=[2, 1, 1]),
    tie_word_embeddings=False,
    bos_token_id=500,
    eos_token_id=500,
    mamba_ssm_dtype="float32",
    mtp_num_hidden_layers=1,
    mtp_use_dedicated_embeddings=False,
)
VISION_CONFIG = dict(
    depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=128, patch_size=16,
    spatial_merge_size=2, temporal_patch_size=2, in_channels=3, num_position_embeddings=64,
    hidden_act="gelu_pytorch_tanh", deepstack_visual_indexes=[],
)
GENERATION_CONFIG = dict(bos_token_id=500, eos_token_id=[501, 500], pad_token_id=500, do_sample=True,
                         temperature=1.0, top_k=20, top_p=0.95)


# ---------------------------------------------------------------- safetensors writer (no dtype limits)
def bf16_bytes(t):
    return t.detach().to(torch.bfloat16).contiguous().view(torch.int16).cpu().numpy().tobytes()


def write_safetensors(path, tensors):
    """tensors: list of (name, dtype_str, shape, bytes)."""
    header, offset = {}, 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, _, _, data in tensors:
            f.write(data)


# ---------------------------------------------------------------- MLX affine quantization (docs/model.md §4.2)
def mlx_quantize(w, bits):
    """w: float32 [..., in] -> (packed uint32 [..., in*bits/32], scales bf16, biases bf16, dequantized fp32)."""
    n_bins = (1 << bits) - 1
    shape = w.shape
    g = w.reshape(*shape[:-1], shape[-1] // GROUP, GROUP).to(torch.float32)
    w_max = g.amax(-1)
    w_min = g.amin(-1)
    scale = torch.clamp((w_max - w_min) / n_bins, min=1e-7)
    use_min = w_min.abs() > w_max.abs()
    edge = torch.where(use_min, w_min, w_max)
    scale = torch.where(use_min, scale, -scale)
    q0 = torch.round(edge / scale)
    nz = q0 != 0
    scale = torch.where(nz, edge / torch.where(nz, q0, torch.ones_like(q0)), scale)
    bias = torch.where(nz, edge, torch.zeros_like(edge))
    q = torch.clamp(torch.round((g - bias[..., None]) / scale[..., None]), 0, n_bins).to(torch.int64)
    scale_b = scale.to(torch.bfloat16)
    bias_b = bias.to(torch.bfloat16)
    deq = (scale_b.float()[..., None] * q.float() + bias_b.float()[..., None]).reshape(shape)
    per_word = 32 // bits
    qw = q.reshape(*shape[:-1], shape[-1] // per_word, per_word)
    packed = torch.zeros(qw.shape[:-1], dtype=torch.int64)
    for j in range(per_word):
        packed |= qw[..., j] << (bits * j)
    packed_np = packed.numpy().astype(np.uint32)
    return packed_np, scale_b, bias_b, deq


# ---------------------------------------------------------------- the model
def build_model():
    from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

    cfg = Qwen3_5MoeConfig(text_config=dict(TEXT_CONFIG), vision_config=dict(VISION_CONFIG),
                           tie_word_embeddings=False)
    cfg.text_config._attn_implementation = "eager"
    try:
        cfg._attn_implementation = "eager"
    except Exception:
        pass
    torch.manual_seed(SEED)
    model = Qwen3_5MoeForConditionalGeneration(cfg).float().eval()
    gen = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("linear_attn.norm.weight"):
                v = 1.0 + 0.2 * torch.randn(p.shape, generator=gen)
            elif name.endswith("A_log"):
                v = torch.log(1.0 + 15.0 * torch.rand(p.shape, generator=gen))
            elif name.endswith("dt_bias"):
                v = 0.5 * torch.randn(p.shape, generator=gen)
            elif name.endswith("norm.weight"):  # zero-centred RMSNorm offsets (input/post/final/q/k)
                v = 0.3 * torch.randn(p.shape, generator=gen)
            elif name.endswith("conv1d.weight"):
                v = 0.5 * torch.randn(p.shape, generator=gen)
            elif "embed_tokens" in name:
                v = torch.randn(p.shape, generator=gen)
            elif name.endswith("mlp.gate.weight"):
                v = 0.5 * torch.randn(p.shape, generator=gen)
            elif p.dim() >= 2:
                v = torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1])
            else:
                v = 0.1 * torch.randn(p.shape, generator=gen)
            # Weights the checkpoint stores in bf16 are bf16-exact; A_log stays fp32.
            if not name.endswith("A_log"):
                v = v.to(torch.bfloat16).float()
            p.copy_(v)
    return cfg, model


def logits_of(model, ids):
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False)
    return out.logits[0].float()


def greedy(model, ids, steps):
    ids = list(ids)
    toks, margins = [], []
    for _ in range(steps):
        lg = logits_of(model, ids)[-1]
        top2 = torch.topk(lg, 2)
        t = int(top2.indices[0])
        toks.append(t)
        margins.append(float(top2.values[0] - top2.values[1]))
        ids.append(t)
    return toks, margins


def write_golden(model, outdir, prompts, vocab):
    os.makedirs(os.path.join(outdir, "golden"), exist_ok=True)
    record = {"vocab": vocab, "cases": []}
    for ids in prompts:
        lg = logits_of(model, ids).numpy().astype(np.float32)
        np.save(os.path.join(outdir, "golden", f"logits_{len(ids)}.npy"), lg)
        toks, margins = greedy(model, ids, CONTINUATION_STEPS)
        record["cases"].append({"prompt": ids, "logits": f"logits_{len(ids)}.npy", "greedy": toks,
                                "margins": margins, "max_abs_logit": float(np.abs(lg).max())})
        print(f"  T={len(ids)}: max|logit|={np.abs(lg).max():.3f} greedy={toks[:8]}... "
              f"min margin={min(margins):.2e}", flush=True)
    with open(os.path.join(outdir, "golden", "golden.json"), "w") as f:
        json.dump(record, f, indent=1)


def config_dict(cfg):
    d = cfg.to_dict()
    d["architectures"] = ["Qwen3_5MoeForConditionalGeneration"]
    return d


# ---------------------------------------------------------------- HF bf16 layout
def save_hf(cfg, model, outdir):
    os.makedirs(outdir, exist_ok=True)
    sd = model.state_dict()
    tensors = []
    for name, t in sd.items():
        if name.endswith("A_log"):
            tensors.append((name, "F32", t.shape, t.float().contiguous().numpy().tobytes()))
        else:
            tensors.append((name, "BF16", t.shape, bf16_bytes(t)))
    # A multi-token-prediction head is present in the real release and must be ignored by the loader.
    H = TEXT_CONFIG["hidden_size"]
    g = torch.Generator().manual_seed(SEED + 7)
    tensors.append(("mtp.fc.weight", "BF16", (H, 2 * H), bf16_bytes(torch.randn(H, 2 * H, generator=g))))
    tensors.append(("mtp.norm.weight", "BF16", (H,), bf16_bytes(torch.randn(H, generator=g))))
    half = len(tensors) // 2
    shards = [tensors[:half], tensors[half:]]
    index = {"metadata": {"total_size": sum(len(t[3]) for t in tensors)}, "weight_map": {}}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors(os.path.join(outdir, fname), shard)
        for t in shard:
            index["weight_map"][t[0]] = fname
    with open(os.path.join(outdir, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=1)
    with open(os.path.join(outdir, "config.json"), "w") as f:
        json.dump(config_dict(cfg), f, indent=1)
    with open(os.path.join(outdir, "generation_config.json"), "w") as f:
        json.dump(GENERATION_CONFIG, f, indent=1)
    print(f"hf: {len(tensors)} tensors in {len(shards)} shards", flush=True)


# ---------------------------------------------------------------- MLX 4-bit layout
RMSNORM_1P = ("input_layernorm.weight", "post_attention_layernorm.weight", "q_norm.weight", "k_norm.weight")


def save_mlx(cfg, model, outdir):
    """Returns the state dict of dequantized fp32 weights (for the reference run)."""
    os.makedirs(outdir, exist_ok=True)
    sd = model.state_dict()
    F = TEXT_CONFIG["moe_intermediate_size"]
    tensors, deq_sd, quant = [], {}, {"group_size": GROUP, "bits": 4, "mode": "affine"}

    def add_quant(mlx_name, w, bits):
        packed, s, b, deq = mlx_quantize(w.float(), bits)
        tensors.append((mlx_name + ".weight", "U32", packed.shape, packed.tobytes()))
        tensors.append((mlx_name + ".scales", "BF16", s.shape, bf16_bytes(s)))
        tensors.append((mlx_name + ".biases", "BF16", b.shape, bf16_bytes(b)))
        if bits != 4:
            quant[mlx_name] = {"group_size": GROUP, "bits": bits}
        return deq

    for name, t in sd.items():
        if name.startswith("model.visual."):
            continue
        if name == "lm_head.weight":
            deq_sd[name] = add_quant("language_model.lm_head", t, 4)
            continue
        assert name.startswith("model.language_model."), name
        mname = "language_model.model." + name[len("model.language_model."):]
        if name.endswith("mlp.experts.gate_up_proj"):
            base = mname[: -len("experts.gate_up_proj")] + "switch_mlp."
            dg = add_quant(base + "gate_proj", t[:, :F, :], 4)
            du = add_quant(base + "up_proj", t[:, F:, :], 4)
            deq_sd[name] = torch.cat([dg, du], dim=1)
        elif name.endswith("mlp.experts.down_proj"):
            base = mname[: -len("experts.down_proj")] + "switch_mlp."
            deq_sd[name] = add_quant(base + "down_proj", t, 4)
        elif name.endswith("mlp.gate.weight") or name.endswith("mlp.shared_expert_gate.weight"):
            deq_sd[name] = add_quant(mname[: -len(".weight")], t, 8)
        elif name.endswith(".weight") and t.dim() == 2 and t.shape[-1] % GROUP == 0:
            deq_sd[name] = add_quant(mname[: -len(".weight")], t, 4)
        elif name.endswith("conv1d.weight"):  # HF [C, 1, K] -> MLX [C, K, 1]
            w = t.permute(0, 2, 1).contiguous()
            tensors.append((mname, "BF16", w.shape, bf16_bytes(w)))
            deq_sd[name] = w.to(torch.bfloat16).float().permute(0, 2, 1).contiguous()
        elif name.endswith(RMSNORM_1P) or name == "model.language_model.norm.weight":
            stored = (1.0 + t.float()).to(torch.bfloat16)  # MLX stores 1 + w, rounded to bf16
            tensors.append((mname, "BF16", t.shape, bf16_bytes(stored)))
            deq_sd[name] = stored.float() - 1.0
        elif name.endswith("A_log"):
            tensors.append((mname, "F32", t.shape, t.float().contiguous().numpy().tobytes()))
            deq_sd[name] = t.float()
        elif name.endswith("linear_attn.norm.weight"):  # plain weight; stored f32 here (both occur)
            tensors.append((mname, "F32", t.shape, t.float().contiguous().numpy().tobytes()))
            deq_sd[name] = t.float()
        else:
            tensors.append((mname, "BF16", t.shape, bf16_bytes(t)))
            deq_sd[name] = t.to(torch.bfloat16).float()
    write_safetensors(os.path.join(outdir, "model.safetensors"), tensors)
    d = config_dict(cfg)
    d["quantization"] = quant
    d["quantization_config"] = dict(quant)
    with open(os.path.join(outdir, "config.json"), "w") as f:
        json.dump(d, f, indent=1)
    with open(os.path.join(outdir, "generation_config.json"), "w") as f:
        json.dump(GENERATION_CONFIG, f, indent=1)
    print(f"mlx: {len(tensors)} tensors, {len(quant) - 3} 8-bit overrides", flush=True)
    return deq_sd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import transformers

    print("torch", torch.__version__, "transformers", transformers.__version__, flush=True)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    cfg, model = build_model()
    names = list(model.state_dict().keys())
    print("state dict:", len(names), "tensors; sample:", [n for n in names if "layers.0." in n][:40], flush=True)

    rng = np.random.default_rng(SEED)
    vocab = TEXT_CONFIG["vocab_size"]
    prompts = [[int(x) for x in rng.integers(0, vocab, size=n)] for n in PROMPT_LENGTHS]

    hf_dir = os.path.join(args.out, "hf")
    save_hf(cfg, model, hf_dir)
    # The checkpoint must load back through transformers itself with nothing missing from the text model.
    from transformers import Qwen3_5MoeForConditionalGeneration

    loaded, info = Qwen3_5MoeForConditionalGeneration.from_pretrained(
        hf_dir, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    loaded = loaded.float().eval()
    print("from_pretrained loading info:", {k: v[:10] if isinstance(v, list) else v for k, v in info.items()},
          flush=True)
    diff = (logits_of(loaded, prompts[2]) - logits_of(model, prompts[2])).abs().max().item()
    print(f"reloaded vs in-memory max |diff| = {diff:.3e}", flush=True)
    assert diff < 1e-5, "the written HF checkpoint does not reproduce the model"
    print("hf reference:", flush=True)
    write_golden(loaded, hf_dir, prompts, vocab)

    mlx_dir = os.path.join(args.out, "mlx")
    deq = save_mlx(cfg, model, mlx_dir)
    missing, unexpected = model.load_state_dict(deq, strict=False)
    assert not [m for m in missing if not m.startswith("model.visual.")], missing
    assert not unexpected, unexpected
    print("mlx reference (dequantized weights):", flush=True)
    write_golden(model, mlx_dir, prompts, vocab)


if __name__ == "__main__":
    main()
