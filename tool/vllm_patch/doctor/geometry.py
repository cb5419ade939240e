"""The attention geometries the doctor plans routes for and checks the kernel in: the query heads, KV heads
and head dim one GPU sees (per tensor-parallel rank), from a model's ``config.json`` or the default model."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import InputError

# Qwen3.6-27B and Qwen3.8-27B: 24 query heads, 4 KV heads of 256 (their full-attention layers).
DEFAULT_MODEL = "Qwen3.6-27B / Qwen3.8-27B"
DEFAULT_HEADS = (24, 4, 256)
DEFAULT_TP = (1, 2)
# Configs whose text part may be nested under text_config (Qwen3.5/3.6/3.8, the VL wrappers).
NESTED_TYPES = ("qwen3_5", "qwen3_next")
DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "half": "float16", "float32": "float32", "float": "float32"}


@dataclass(frozen=True)
class Geometry:
    """One rank's attention: ``num_heads`` query heads over ``num_kv_heads`` KV heads of ``head_dim``."""

    label: str
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tp: int

    @property
    def group(self) -> int:
        return self.num_heads // self.num_kv_heads

    def to_dict(self) -> dict:
        return {**asdict(self), "group": self.group}


@dataclass(frozen=True)
class Model:
    name: str
    geometries: list[Geometry]
    dtype: str


def _text_config(config: dict) -> dict:
    nested = config.get("text_config")
    if isinstance(nested, dict) and (str(config.get("model_type", "")).startswith(NESTED_TYPES)
                                     or "num_attention_heads" not in config):
        return {**config, **nested}
    return config


def _heads(cfg: dict, prefix: str, where: str, dim: int | None = None) -> tuple[int, int, int] | None:
    """(query heads, KV heads, head dim) from the keys with `prefix`; `dim` when it names no head dim."""
    heads = cfg.get(f"{prefix}num_attention_heads")
    if heads is None:
        return None
    kv = cfg.get(f"{prefix}num_key_value_heads") or heads
    dim = cfg.get(f"{prefix}head_dim") or dim or (cfg.get("hidden_size", 0) // heads if heads else 0)
    try:
        heads, kv, dim = int(heads), int(kv), int(dim)
    except (TypeError, ValueError):
        raise InputError(f"{where}: {prefix}num_attention_heads, num_key_value_heads or head_dim is not a number") \
            from None
    if heads <= 0 or kv <= 0 or dim <= 0 or heads % kv:
        raise InputError(f"{where}: {heads} query heads over {kv} KV heads of {dim} is not an attention geometry")
    return heads, kv, dim


def per_rank(label: str, heads: tuple[int, int, int], tps: tuple[int, ...]) -> list[Geometry]:
    """The geometry each rank sees at each tensor-parallel size that divides the query heads (KV heads
    replicated where there are fewer than ranks, as vLLM does)."""
    hq, hk, d = heads
    out = []
    for tp in tps:
        if hq % tp or (hk >= tp and hk % tp) or (hk < tp and tp % hk):
            continue
        out.append(Geometry(label, hq // tp, max(1, hk // tp), d, tp))
    return out


def model(model_dir: Path | None, tps: tuple[int, ...] = DEFAULT_TP) -> Model:
    """The geometries of `model_dir`'s config.json (the MTP layer's too where its heads differ), or of the
    default model."""
    if model_dir is None:
        return Model(DEFAULT_MODEL, per_rank(DEFAULT_MODEL, DEFAULT_HEADS, tps), "bfloat16")
    path = Path(model_dir) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise InputError(f"{path} is not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise InputError(f"{path} is not a JSON object")
    cfg = _text_config(config)
    main = _heads(cfg, "", str(path))
    if main is None:
        raise InputError(f"{path} names no num_attention_heads (nor does its text_config)")
    name = Path(model_dir).name or str(model_dir)
    geometries = per_rank(name, main, tps)
    mtp = _heads(cfg, "mtp_", str(path), main[2])
    if mtp is not None and mtp != main:
        geometries += per_rank(f"{name} MTP", mtp, tps)
    if not geometries:
        raise InputError(f"{path}: no tensor-parallel size of {', '.join(map(str, tps))} divides "
                         f"{main[0]} query heads over {main[1]} KV heads")
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    return Model(name, geometries, DTYPES.get(dtype, "bfloat16"))
