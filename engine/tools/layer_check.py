"""Exact checks of the quantised layers on a device: each layer's output against its own dequantised weight.

A wrong packing (nibble order, tile layout, scale and zero order) gives plausible-looking but wrong logits that
no parity check against another quantised run catches. Here every layer is built from known codes and scales,
and its output for random activations is compared with ``x @ W.T`` where ``W`` is rebuilt from those codes in
float32 on the host. The kernels compute in bfloat16, so the tolerance is a relative error (largest absolute
difference over the reference's largest value) of ``TOLERANCE``; a wrong layout is off by order 1.

- int4 (torch's ``_weight_int4pack_mm``): every CUDA layout the shape takes (``inner_k_tiles`` 8, 4, 2), each
  timed at 1 and 16 rows, since the widest is picked by default (:func:`.packed_linear.cuda_inner_k_tiles`);
- w8 (``Int8Linear``): codes times the per-row scale;
- nf4 (bitsandbytes, CUDA only here): against bitsandbytes' own ``dequantize_4bit`` of the same weight.
"""

from __future__ import annotations

import time

import torch

from ..step.packed_linear import CUDA_INNER_K_TILES, Int4Linear, Int8Linear, quantize_int4, quantize_int8

TOLERANCE = 0.02
GROUP = 32
SHAPES = {"cpu": [(64, 128), (576, 1536)], "cuda": [(576, 1536), (1024, 2816), (4096, 14336), (14336, 4096)]}


def layer_outputs(device: str) -> dict:
    """Per shape and layer kind: the relative error against the dequantised weight and the time per call."""
    target = torch.device(device)
    results, failures = {}, []
    for in_features, out_features in SHAPES[target.type]:
        torch.manual_seed(in_features + out_features)
        weight = torch.randn(out_features, in_features) * 0.02
        rows = torch.randn(16, in_features).to(torch.bfloat16)
        checks = {**_int4_layers(weight, target), "w8": _w8_layer(weight, target)}
        if target.type == "cuda":
            checks["nf4"] = _nf4_layer(weight, target)
        shape = f"{in_features}x{out_features}"
        results[shape] = {}
        for name, (layer, reference) in checks.items():
            row = _measure(layer, reference, rows, target)
            results[shape][name] = row
            if not row["relative_error"] <= TOLERANCE:
                failures.append(f"{shape} {name}: relative error {row['relative_error']:.3g}")
    if failures:
        raise AssertionError(f"layer outputs differ from their dequantised weights: {failures}; {results}")
    return results


def _int4_layers(weight: torch.Tensor, device: torch.device) -> dict:
    codes, scales, zeros = quantize_int4(weight, GROUP)
    reference = (codes.float() - 8) * scales.repeat_interleave(GROUP, 1) + zeros.repeat_interleave(GROUP, 1)
    if device.type != "cuda":
        return {"int4": (Int4Linear.from_codes(codes, scales, zeros, GROUP, device=device), reference)}
    layouts = [tiles for tiles in CUDA_INNER_K_TILES if weight.shape[1] % (16 * tiles) == 0]
    return {f"int4_tiles{tiles}": (Int4Linear.from_codes(codes, scales, zeros, GROUP, device=device,
                                                         inner_k_tiles=tiles), reference) for tiles in layouts}


def _w8_layer(weight: torch.Tensor, device: torch.device):
    codes, scales = quantize_int8(weight)
    return Int8Linear(codes, scales).to(device), codes.float() * scales[:, None]


def _nf4_layer(weight: torch.Tensor, device: torch.device):
    from ..step.quantization import import_bitsandbytes, quantized_layer

    bnb = import_bitsandbytes()
    layer = quantized_layer(weight.to(torch.bfloat16), None, "nf4", torch.bfloat16, device)
    reference = bnb.functional.dequantize_4bit(layer.weight.data, layer.weight.quant_state).float().cpu()
    return layer, reference


def _measure(layer, reference: torch.Tensor, rows: torch.Tensor, device: torch.device) -> dict:
    """The relative error at 1 and 16 rows (the larger), and milliseconds a call at each."""
    result, errors = {}, []
    with torch.inference_mode():
        for count in (1, 16):
            x = rows[:count].to(device)
            want = x.float().cpu() @ reference.t()
            errors.append(float((layer(x).float().cpu() - want).abs().max() / want.abs().max()))
            result[f"ms_{count}_rows"] = round(_time_ms(lambda x=x: layer(x), device), 4)
    result["relative_error"] = max(errors)
    return result


def _time_ms(call, device: torch.device, repeat: int = 20) -> float:
    """Mean milliseconds a call over ``repeat`` calls after a warm-up, the device's queue drained at both ends."""
    call()
    _drain(device)
    started = time.perf_counter()
    for _ in range(repeat):
        call()
    _drain(device)
    return (time.perf_counter() - started) * 1000 / repeat


def _drain(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
