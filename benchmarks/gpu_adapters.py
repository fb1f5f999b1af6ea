"""The transformers VLM adapters on a real GPU: loading, answers, batching and throughput (needs CUDA for its figures;
`--device cpu` dry-runs the same code). Prints figures; exits 1 when a check fails.

1. Loading. Each family's tiny random model (`vlm.tiny_*`) is saved to a folder and loaded back by its adapter, the
   way a user's run loads a Hub model (`model_id=<folder>`, `device`, `dtype`): the weights must land on the device
   in the dtype asked for.
2. Answers. On `--n` questions of three views each: the device's float32 answers against the CPU's (same weights),
   batches of 4 against batches of 1 on the device (left padding must change nothing: a failed check), bfloat16
   against float32, and the largest difference of the first step's logits, device against CPU.
3. Throughput. A random Qwen2.5-VL of Qwen2.5-VL-3B-Instruct's shape (3.75 B parameters, its vocabulary and vision
   tower), bfloat16, on three 448-pixel views per question (the pipeline's `render.size`), 16 new tokens (random
   weights never stop early: the worst case): questions per second per batch size, with the share of the time spent
   on the CPU encoding a batch (chat template, PIL image processor) rather than generating.

    python benchmarks/gpu_adapters.py [--n 8] [--throughput-n 32] [--batch-sizes 1,4,8,16] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from spatialvqa import vlm  # noqa: E402  (importing it registers the transformers adapters)
from spatialvqa.models.registry import make_adapter  # noqa: E402

FAMILIES = {
    "qwen2_5_vl": lambda: vlm.tiny_qwen_vl("2.5"),
    "qwen3_vl": lambda: vlm.tiny_qwen_vl("3"),
    "gemma3": vlm.tiny_gemma3,
    "llava_onevision": vlm.tiny_llava_onevision,
}


def saved(build, folder: Path) -> Path:
    "A tiny model, its tokenizer and image processor saved as a Hub-style folder."
    model, tok, ip = build()
    for obj in (model, tok, ip):
        obj.save_pretrained(folder)
    return folder


def first_logits(a, inputs) -> torch.Tensor:
    enc = {k: v.to(a.model.device) if torch.is_tensor(v) else v for k, v in a.encode(inputs).items()}
    enc = {k: v.to(a.model.dtype) if torch.is_tensor(v) and torch.is_floating_point(v) else v for k, v in enc.items()}
    with torch.inference_mode():  # through generate, which builds the multimodal position ids (Qwen3-VL's M-RoPE)
        out = a.model.generate(
            **enc, max_new_tokens=1, do_sample=False, output_logits=True, return_dict_in_generate=True
        )
    return out.logits[0].float().cpu()


def check_family(family: str, folder: Path, inputs, device: str) -> dict:
    ad = lambda dev, dtype, bs: make_adapter(
        family, {"model_id": str(folder), "device": dev, "dtype": dtype, "batch_size": bs, "max_new_tokens": 4}
    )
    cpu, f32, b16 = ad("cpu", "float32", 1), ad(device, "float32", 1), ad(device, "bfloat16", 4)
    ref = cpu.predict(inputs)
    one = f32.predict(inputs)
    f32.batch_size = 4
    four = f32.predict(inputs)
    half = b16.predict(inputs)
    lc, ld = first_logits(cpu, inputs[:1]), first_logits(f32, inputs[:1])
    return {
        "family": family,
        "device": str(f32.model.device),
        "dtype_f32": str(f32.model.dtype),
        "dtype_bf16": str(b16.model.dtype),
        "on_device": f32.model.device.type == device and b16.model.device.type == device,
        "dtypes_right": f32.model.dtype == torch.float32 and b16.model.dtype == torch.bfloat16,
        "device_vs_cpu": sum(x == y for x, y in zip(one, ref)),
        "batch4_vs_batch1": sum(x == y for x, y in zip(four, one)),
        "bf16_vs_f32": sum(x == y for x, y in zip(half, one)),
        "n": len(inputs),
        "max_logit_diff": float((lc - ld).abs().max()),
        "logit_scale": float(lc.std()),
    }


def family_failures(r: dict) -> list[str]:
    "What a family's report fails: weights elsewhere or in another dtype; batches answering otherwise than one by one."
    out = []
    if not (r["on_device"] and r["dtypes_right"]):
        out.append(f"{r['family']}: weights not on the device in the dtype asked for")
    if r["batch4_vs_batch1"] != r["n"]: out.append(f"{r['family']}: batches of 4 answer differently from batches of 1")
    return out


def qwen25_3b_shape(tok) -> transformers.Qwen2_5_VLConfig:
    "Qwen2.5-VL-3B-Instruct's published shape (config.json of the release), with the tiny tokenizer's special ids."
    ids = {
        s: tok.convert_tokens_to_ids(s)
        for s in (
            "<|endoftext|>",
            "<|im_end|>",
            "<|image_pad|>",
            "<|video_pad|>",
            "<|vision_start|>",
            "<|vision_end|>",
        )
    }
    text = dict(
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=11008,
        num_hidden_layers=36,
        num_attention_heads=16,
        num_key_value_heads=2,
        max_position_embeddings=128000,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]},
    )
    vision = dict(
        depth=32,
        hidden_size=1280,
        intermediate_size=3420,
        num_heads=16,
        out_hidden_size=2048,
        patch_size=14,
        spatial_merge_size=2,
        temporal_patch_size=2,
        window_size=112,
        fullatt_block_indexes=[7, 15, 23, 31],
    )
    return transformers.Qwen2_5_VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )


def sync(device: str):
    if device == "cuda":
        torch.cuda.synchronize()


def throughput(inputs, batch_sizes, device: str, small: bool) -> list[dict]:
    _, tok, _ = vlm.tiny_qwen_vl("2.5")
    cfg = qwen25_3b_shape(tok)
    if small:  # a CPU dry run: the same code on a model small enough to run there
        cfg.text_config.num_hidden_layers, cfg.vision_config.depth, cfg.vision_config.fullatt_block_indexes = (
            1,
            1,
            [0],
        )
    torch.manual_seed(0)
    t = time.perf_counter()
    with torch.device(device):
        torch.set_default_dtype(torch.bfloat16)
        model = transformers.Qwen2_5_VLForConditionalGeneration(cfg).eval()
        torch.set_default_dtype(torch.float32)
    sync(device)
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"random Qwen2.5-VL-3B shape: {n_params / 1e9:.2f} B parameters, {model.dtype}, "
        f"built in {time.perf_counter() - t:.1f} s"
    )
    ip = transformers.Qwen2VLImageProcessorPil(patch_size=14)
    rows = []
    for bs in batch_sizes:
        a = vlm.Qwen25VL(model=model, tokenizer=tok, image_processor=ip, batch_size=bs, max_new_tokens=16)
        a.predict(inputs[:bs])  # warm-up: kernels chosen, caches filled
        if device == "cuda": torch.cuda.reset_peak_memory_stats()   # each batch size's own peak
        sync(device)
        t = time.perf_counter()
        enc_s = 0.0
        for i in range(0, len(inputs), bs):
            e = time.perf_counter()
            a.encode(inputs[i : i + bs])
            enc_s += time.perf_counter() - e
        t_enc = time.perf_counter() - t
        t = time.perf_counter()
        out = a.predict(inputs)
        sync(device)
        total = time.perf_counter() - t
        n_img = int((a.encode(inputs[:1])["input_ids"] == cfg.image_token_id).sum())
        rows.append(
            {
                "batch_size": bs,
                "questions": len(out),
                "seconds": total,
                "questions_per_s": len(out) / total,
                "new_tokens_per_s": 16 * len(out) / total,
                "encode_share": min(1.0, t_enc / total),
                "image_tokens_per_question": n_img,
                "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None,
            }
        )
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--throughput-n", type=int, default=32)
    ap.add_argument("--batch-sizes", default="1,4,8,16")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_adapters: no CUDA device here (--device cpu dry-runs it)")
    dev = a.device
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, {os.cpu_count()} cores, "
        f"{torch.cuda.get_device_name() if dev == 'cuda' else 'CPU only'}, load average {os.getloadavg()[0]:.1f}"
    )
    report, failed = {"families": [], "throughput": []}, []
    with tempfile.TemporaryDirectory() as d:
        small = vlm.tiny_inputs(Path(d) / "small", n=a.n, views=3)
        print(f"\n1-2. tiny models saved and loaded by their adapters; {a.n} questions, 3 views each")
        print(
            f"{'family':<16} {'device':<8} {'on dev':>6} {'dtypes':>6} "
            f"{'dev=cpu':>8} {'b4=b1':>6} {'bf16=f32':>8} {'max |dlogit|':>12}"
        )
        for fam, build in FAMILIES.items():
            try:
                r = check_family(fam, saved(build, Path(d) / fam), small, dev)
            except Exception as e:
                failed.append(f"{fam}: {type(e).__name__}: {e}")
                print(f"{fam:<16} FAILED: {type(e).__name__}: {e}")
                continue
            report["families"].append(r)
            print(
                f"{fam:<16} {r['device']:<8} {str(r['on_device']):>6} {str(r['dtypes_right']):>6} "
                f"{r['device_vs_cpu']:>5}/{r['n']}"
                f" {r['batch4_vs_batch1']:>3}/{r['n']} {r['bf16_vs_f32']:>5}/{r['n']} "
                f"{r['max_logit_diff']:>8.1e} (sd {r['logit_scale']:.2f})"
            )
            failed += family_failures(r)
        big = vlm.tiny_inputs(Path(d) / "big", n=a.throughput_n, views=3, size=(448, 448))
        print(f"\n3. throughput: {a.throughput_n} questions, three 448-px views each, 16 new tokens")
        try:
            report["throughput"] = throughput(
                big, [int(b) for b in a.batch_sizes.split(",")], dev, small=dev != "cuda"
            )
        except Exception as e:
            failed.append(f"throughput: {type(e).__name__}: {e}")
        print(
            f"{'batch':>5} {'questions/s':>11} {'new tok/s':>9} "
            f"{'encode share':>12} {'image tok/q':>11} {'peak GiB':>8}"
        )
        for r in report["throughput"]:
            peak = f"{r['peak_gib']:.1f}" if r["peak_gib"] is not None else "-"
            print(
                f"{r['batch_size']:>5} {r['questions_per_s']:>11.2f} "
                f"{r['new_tokens_per_s']:>9.1f} {r['encode_share']:>11.0%}"
                f" {r['image_tokens_per_question']:>11} {peak:>8}"
            )
    report["failed"] = failed
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))
    print("\n" + ("every check passed" if not failed else "FAILED:\n  " + "\n  ".join(failed)))
    sys.exit(1 if failed else 0)
