"""Load and validate target descriptions.

A target is a YAML file (``targets/<name>.yaml`` or any path) validated against ``SCHEMA`` into a
frozen ``Target``. Errors name the file, the key and the expected type. Compiler code reads target
*features*; it never tests target names.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..errors import TargetError

HERE = Path(__file__).parent

# key -> (python types accepted, required, description)
SCHEMA: dict[str, tuple[tuple[type, ...], bool, str]] = {
    "name": ((str,), True, "target name"),
    "kind": ((str,), True, "'cpu' or 'gpu'"),
    "vendor": ((str,), True, "intel, amd, nvidia, arm, generic"),
    "backend": ((str,), True, "'c' for CPUs, 'triton' for GPUs"),
    "arch": ((str,), True, "x86-64-v3, x86-64-v4, armv8.2-a, native, sm_80, sm_90, gfx942 ..."),
    "description": ((str,), False, "one line for `deploy targets`"),
    "vector_bits": ((int,), False, "SIMD width in bits (CPU)"),
    "isa": ((list,), False, "ISA feature list, e.g. [avx2, fma, avx512f]"),
    "cores": ((int,), False, "cores (CPU) to plan parallelism for; 0 = detect at run time"),
    "warp_size": ((int,), False, "threads per warp / wavefront (GPU)"),
    "sm_count": ((int,), False, "SMs or CUs (GPU)"),
    "shared_mem_per_block": ((int,), False, "bytes of shared memory per block (GPU)"),
    "registers_per_sm": ((int,), False, "32-bit registers per SM (GPU)"),
    "l2_bytes": ((int,), False, "L2 cache bytes"),
    "mem_bandwidth_gbs": ((int, float), False, "DRAM bandwidth, GB/s"),
    "peak_tflops": ((dict,), False, "peak TFLOP/s per dtype, e.g. {fp32: 67, fp16: 990}"),
    "preferred_layout": ((str,), False, "'NCHW' or 'NHWC' for convolutions"),
    "cc_flags": ((list,), False, "extra C compiler flags (CPU)"),
}
KINDS = {"cpu", "gpu"}
LAYOUTS = {"NCHW", "NHWC"}


@dataclass(frozen=True)
class Target:
    name: str
    kind: str
    vendor: str
    backend: str
    arch: str
    description: str = ""
    vector_bits: int = 128
    isa: tuple[str, ...] = ()
    cores: int = 0
    warp_size: int = 0
    sm_count: int = 0
    shared_mem_per_block: int = 0
    registers_per_sm: int = 0
    l2_bytes: int = 0
    mem_bandwidth_gbs: float = 0.0
    peak_tflops: tuple[tuple[str, float], ...] = ()
    preferred_layout: str = "NCHW"
    cc_flags: tuple[str, ...] = ()
    source: str = field(default="", compare=False)

    def features(self) -> dict:
        """What kernels depend on; the key of tuning records (never the machine's name)."""
        return {"kind": self.kind, "backend": self.backend, "arch": self.arch,
                "vector_bits": self.vector_bits, "isa": sorted(self.isa),
                "warp_size": self.warp_size}

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in SCHEMA}
        d["isa"], d["cc_flags"] = list(self.isa), list(self.cc_flags)
        d["peak_tflops"] = dict(self.peak_tflops)
        return d


def list_targets() -> list[str]:
    return sorted(p.stem for p in HERE.glob("*.yaml"))


def load_target(spec: str | Target = "host") -> Target:
    """A target by name (``targets/NAME.yaml``) or by path to a YAML file."""
    if isinstance(spec, Target):
        return spec
    path = Path(spec)
    if path.suffix in (".yaml", ".yml") or os.sep in str(spec):
        if not path.exists():
            raise TargetError(f"{spec}: target file not found")
    else:
        path = HERE / f"{spec}.yaml"
        if not path.exists():
            raise TargetError(f"unknown target '{spec}'; known targets: {', '.join(list_targets())}"
                              " (or pass a path to a YAML file)")
    return parse_target(path)


def parse_target(path: Path) -> Target:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise TargetError(f"{path}: not valid YAML ({e})") from None
    if not isinstance(data, dict):
        raise TargetError(f"{path}: expected a mapping of keys to values at the top level")
    problems = []
    for key, (types, required, desc) in SCHEMA.items():
        if key not in data:
            if required:
                problems.append(f"missing required key '{key}' ({desc})")
        elif not isinstance(data[key], types) or isinstance(data[key], bool):
            want = " or ".join(t.__name__ for t in types)
            problems.append(f"key '{key}' must be {want} ({desc}), got "
                            f"{type(data[key]).__name__} {data[key]!r}")
    problems += [f"unknown key '{k}'; accepted keys: {', '.join(SCHEMA)}" for k in data
                 if k not in SCHEMA]
    if not problems:
        problems += _check_values(data)
    if problems:
        raise TargetError(f"{path}: invalid target description:\n  - " + "\n  - ".join(problems))
    data = dict(data)
    data["isa"] = tuple(data.get("isa", ()))
    data["cc_flags"] = tuple(data.get("cc_flags", ()))
    data["peak_tflops"] = tuple(sorted((str(k), float(v))
                                       for k, v in data.get("peak_tflops", {}).items()))
    return Target(**data, source=str(path))


def _check_values(data: dict) -> list[str]:
    problems = []
    if data["kind"] not in KINDS:
        problems.append(f"key 'kind' must be one of {sorted(KINDS)}, got {data['kind']!r}")
    if data.get("preferred_layout", "NCHW") not in LAYOUTS:
        problems.append(f"key 'preferred_layout' must be one of {sorted(LAYOUTS)}")
    if data["kind"] == "gpu":
        for key in ("warp_size", "sm_count", "shared_mem_per_block"):
            if key not in data:
                problems.append(f"GPU targets need key '{key}' ({SCHEMA[key][2]})")
    for k, v in data.get("peak_tflops", {}).items():
        if not isinstance(v, (int, float)):
            problems.append(f"key 'peak_tflops.{k}' must be a number, got {v!r}")
    return problems
