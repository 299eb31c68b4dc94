"""Load and validate target descriptions.

A target is a YAML file (``targets/<name>.yaml`` or any path) validated against ``SCHEMA`` into a
frozen ``Target``. Errors name the file, the key and the expected type. Compiler code reads target
*features*; it never tests target names.
"""
from __future__ import annotations

import os
import re
import reprlib
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
    "backend": ((str,), True, "'c' for CPUs, 'triton' or 'cuda' for GPUs (the default)"),
    "backends": ((list,), False, ("code generators a GPU target may use per kernel "
                                  "(--gpu-codegen), e.g. [triton, cuda]; default [backend]")),
    "arch": ((str,), True, "x86-64-v3, x86-64-v4, armv8.2-a, native, sm_80, sm_90, gfx942 ..."),
    "description": ((str,), False, "one line for `deploy targets`"),
    "triple": ((str,), False, "code generated for, e.g. x86_64-linux-gnu (CPU; absent = host)"),
    "vector_bits": ((int,), False, "SIMD width in bits (CPU): 128, 256 or 512"),
    "isa": ((list,), False, "ISA feature list, e.g. [avx2, fma, avx512f]"),
    "cores": ((int,), False, "cores (CPU) to plan parallelism for; 0 = detect at run time"),
    "warp_size": ((int,), False, "threads per warp / wavefront (GPU): 32 or 64"),
    "sm_count": ((int,), False, "SMs or CUs (GPU)"),
    "max_threads_per_block": ((int,), False, "threads per block / workgroup (GPU)"),
    "shared_mem_per_block": ((int,), False, "bytes of shared memory (LDS) one block may use (GPU)"),
    "shared_mem_per_sm": ((int,), False, "bytes of shared memory (LDS) per SM / CU (GPU)"),
    "registers_per_sm": ((int,), False, "32-bit registers per SM / CU (GPU)"),
    "l2_bytes": ((int,), False, "L2 cache bytes (whole device)"),
    "memory_bytes": ((int,), False, "device memory bytes (GPU)"),
    "mem_bandwidth_gbs": ((int, float), False, "DRAM bandwidth, GB/s"),
    "peak_tflops": ((dict,), False, ("dense peak TFLOP/s (TOP/s for int8) per dtype, "
                                     "e.g. {fp32: 67, fp16: 989}")),
    "preferred_layout": ((str,), False, "'NCHW' or 'NHWC' for convolutions"),
    "cc_flags": ((list,), False, "extra C compiler flags (CPU)"),
    "int8": ((str,), False, ("integer kernels for int8 QDQ contractions: amx, vnni, sdot, avx2, scalar "
                             "or none (CPU), mma or none (GPU); absent = chosen from isa "
                             "(int8_path)")),
    "bf16": ((str,), False, ("CPU contractions under --dtype bf16: dot (packed bf16 weights, "
                             "AMX / AVX512-BF16 dot products where compiled for them) or none "
                             "(bf16 storage, float32 loops); absent = dot where the ISA has "
                             "avx512_bf16 or amx_bf16 (bf16_path)")),
    "winograd": ((str,), False, ("float32 3 x 3 convolutions at stride 1 (CPU): auto (Winograd "
                                 "F(4x4, 3x3) or F(2x2, 3x3) by the layer's size), f2x2 (F(2x2, "
                                 "3x3) only) or none; absent = auto")),
}
KINDS = {"cpu", "gpu"}
BACKENDS = {"cpu": {"c"}, "gpu": {"triton", "cuda"}}
LAYOUTS = {"NCHW", "NHWC"}
PEAK_DTYPES = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "int8")
VECTOR_BITS = {128, 256, 512}
WARP_SIZES = {32, 64}
INT8_PATHS = {"cpu": ("amx", "vnni", "sdot", "avx2", "scalar", "none"), "gpu": ("mma", "none")}
BF16_PATHS = ("dot", "none")
WINOGRAD_PATHS = ("auto", "f2x2", "none")
HOST_ISA = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_vnni",
            "avx_vnni", "amx_tile", "amx_int8", "amx_bf16", "asimd", "asimddp")  # /proc/cpuinfo
GPU_ARCH = {"nvidia": re.compile(r"sm_\d+a?$"), "amd": re.compile(r"gfx[0-9a-f]+$")}
GPU_REQUIRED = ("warp_size", "sm_count", "shared_mem_per_block")


@dataclass(frozen=True)
class Target:
    name: str
    kind: str
    vendor: str
    backend: str
    arch: str
    backends: tuple[str, ...] = ()
    description: str = ""
    triple: str = ""
    vector_bits: int = 128
    isa: tuple[str, ...] = ()
    cores: int = 0
    warp_size: int = 0
    sm_count: int = 0
    max_threads_per_block: int = 0
    shared_mem_per_block: int = 0
    shared_mem_per_sm: int = 0
    registers_per_sm: int = 0
    l2_bytes: int = 0
    memory_bytes: int = 0
    mem_bandwidth_gbs: float = 0.0
    peak_tflops: tuple[tuple[str, float], ...] = ()
    preferred_layout: str = "NCHW"
    cc_flags: tuple[str, ...] = ()
    int8: str = ""
    bf16: str = ""
    winograd: str = ""
    source: str = field(default="", compare=False)

    def int8_path(self, isa=None) -> str:
        """Which int8 contraction kernels this target runs (``int8_path``); ``isa`` is the
        detected feature list for ``native`` targets (the backend reads the host's)."""
        return int8_path(self, self.isa if isa is None else isa)

    def cpu_isa(self) -> tuple[str, ...]:
        """The ISA features kernels may use: the ``isa`` key, or this CPU's for ``native``
        targets without one."""
        return self.isa if self.isa or self.arch != "native" else tuple(host_isa())

    def bf16_path(self) -> str:
        """``dot`` where ``--dtype bf16`` contractions take the packed bf16 kernels
        (backends/c/qgemm.h), else ``none``: the ``bf16`` key, or ``dot`` on CPUs whose ISA
        has bf16 dot products (``avx512_bf16``, ``amx_bf16``)."""
        if self.bf16 or self.kind != "cpu":
            return self.bf16 or "none"
        return "dot" if {"avx512_bf16", "amx_bf16"} & set(self.cpu_isa()) else "none"

    def winograd_path(self) -> str:
        """Which Winograd convolutions float32 3 x 3 layers may take (C backend): ``auto``
        (F(4x4, 3x3) or F(2x2, 3x3) by size), ``f2x2`` or ``none``: the ``winograd`` key,
        ``auto`` on CPU targets without one, ``none`` on GPUs."""
        if self.kind != "cpu":
            return "none"
        return self.winograd or "auto"

    def features(self) -> dict:
        """What kernels depend on; the key of tuning records (never the machine's name)."""
        return {"kind": self.kind, "backend": self.backend, "arch": self.arch,
                "vector_bits": self.vector_bits, "isa": sorted(self.isa),
                "warp_size": self.warp_size}

    def peak(self, dtype: str) -> float:
        """Dense peak TFLOP/s for ``dtype`` (``fp32``, ``fp16`` ...), 0.0 if not described."""
        return dict(self.peak_tflops).get(dtype, 0.0)

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in SCHEMA}
        d["isa"], d["cc_flags"] = list(self.isa), list(self.cc_flags)
        d["backends"] = list(self.backends)
        d["peak_tflops"] = dict(self.peak_tflops)
        return d


def int8_path(target: Target, isa) -> str:
    """The int8 kernels of a target: its ``int8`` key where given; else ``amx`` where the ISA
    has AMX tiles (``amx_tile`` and ``amx_int8``: the vnni kernels, with whole 64-byte k steps
    on the tile registers where the OS grants them), ``vnni`` where it
    has u8 x s8 dot products (``avx512_vnni`` with ``avx512vl``, or ``avx_vnni``), ``sdot`` on
    Arm CPUs with int8 dot products (``dotprod`` in a target's ISA, ``asimddp`` on the host), ``avx2``
    (int8 widened to int16, ``_mm256_madd_epi16``) with AVX2, ``scalar`` on other CPUs, and
    ``mma`` (int8 tensor cores through ``tl.dot``, backends/triton/qgemm.py) on GPUs."""
    if target.int8:
        return target.int8
    if target.kind != "cpu":
        return "mma"
    isa = set(isa)
    if {"amx_tile", "amx_int8"} <= isa:
        return "amx"
    if "avx_vnni" in isa or {"avx512_vnni", "avx512vl"} <= isa:
        return "vnni"
    if "dotprod" in isa or "asimddp" in isa:
        return "sdot"
    return "avx2" if "avx2" in isa else "scalar"


def host_isa() -> list[str]:
    """The ``HOST_ISA`` features this CPU has (empty where /proc/cpuinfo cannot be read)."""
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return []
    return [f for f in HOST_ISA if f in flags]


def list_targets() -> list[str]:
    """Names of the targets shipped in ``targets/``."""
    return sorted(p.stem for p in HERE.glob("*.yaml"))


def load_target(spec: str | os.PathLike | Target = "host") -> Target:
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


MAX_FILE_BYTES = 64 << 10  # target descriptions are a few hundred bytes (YAML parses at ~50 KB/s)


class _Loader(yaml.SafeLoader):
    """Safe YAML without aliases (``*name``: an alias bomb expands to billions of values)
    and without a key given twice (which one counts would be a guess)."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not accepted in "
                                              "target files", event.start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, str):
                continue  # (the schema check names it)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"key {_short(key)} is given "
                                                        "twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def parse_target(path: Path) -> Target:
    """Read and validate one YAML file; every problem is reported at once."""
    data = _read_yaml(Path(path))
    if not isinstance(data, dict):
        raise TargetError(f"{path}: expected a mapping of keys to values at the top level, "
                          f"got {type(data).__name__}")
    problems = _check_types(data)
    if not problems:
        problems += _check_values(data)
    if problems:
        raise TargetError(f"{path}: invalid target description:\n  - " + "\n  - ".join(problems))
    data = dict(data)
    data["backends"] = tuple(str(x) for x in data.get("backends", [data["backend"]]))
    data["isa"] = tuple(str(x) for x in data.get("isa", ()))
    data["cc_flags"] = tuple(str(x) for x in data.get("cc_flags", ()))
    data["peak_tflops"] = tuple(sorted((str(k), float(v))
                                       for k, v in data.get("peak_tflops", {}).items()))
    if data.get("arch") == "native" and data.get("kind") == "cpu":
        data["vector_bits"] = min(data.get("vector_bits", 128), native_vector_bits())
    return Target(**data, source=str(path))


def _read_yaml(path: Path):
    """The file's YAML data: at most MAX_FILE_BYTES of UTF-8 text, safe YAML without aliases
    or repeated keys."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise TargetError(f"{path}: cannot read target file ({e.strerror})") from None
    if len(raw) > MAX_FILE_BYTES:
        raise TargetError(f"{path}: more than {MAX_FILE_BYTES >> 10} KB; a target description is "
                          "a few hundred bytes of YAML (see targets/host.yaml)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TargetError(f"{path}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset "
                          f"{e.start}); save the target file as UTF-8") from None
    try:
        return yaml.load(text, Loader=_Loader)  # (a SafeLoader)
    except yaml.YAMLError as e:
        raise TargetError(f"{path}: not valid YAML{_yaml_where(e)}") from None
    except RecursionError:
        raise TargetError(f"{path}: not valid YAML (nested too deeply)") from None


def _short(value, limit: int = 60, quote: bool = True) -> str:
    """``repr(value)`` (``str`` without ``quote``) cut to ``limit`` characters (a message never
    quotes a whole file)."""
    text = reprlib.repr(value) if quote else str(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def native_vector_bits() -> int:
    """The widest vectors this CPU runs natively (x86-64: 512 with AVX-512, 256 with AVX2);
    a ``native`` target's ``vector_bits`` is capped by it (512-bit tiles on an AVX2 CPU would
    spill half their accumulators). 512 where the flags cannot be read (the compiler decides)."""
    from ..runtime.cpu_features import host_flags
    flags = host_flags()
    if flags is None:
        return 512
    return 512 if "avx512f" in flags else 256 if "avx2" in flags else 128


def _yaml_where(e: yaml.YAMLError) -> str:
    mark, problem = getattr(e, "problem_mark", None), getattr(e, "problem", None)
    if mark is None:
        return f" ({' '.join(str(e).split())})"
    return f" at line {mark.line + 1}, column {mark.column + 1}: {problem or e}"


def _check_types(data: dict) -> list[str]:
    problems = []
    for key, (types, required, desc) in SCHEMA.items():
        if key not in data:
            if required:
                problems.append(f"missing required key '{key}' ({desc})")
        elif not isinstance(data[key], types) or isinstance(data[key], bool):
            want = " or ".join(t.__name__ for t in types)
            problems.append(f"key '{key}' must be {want} ({desc}), got "
                            f"{type(data[key]).__name__} {_short(data[key])}")
        elif types == (list,) and not all(isinstance(x, str) for x in data[key]):
            problems.append(f"key '{key}' must be a list of strings ({desc}), got "
                            f"{_short(data[key])}")
    problems += [f"unknown key {_short(k)}; accepted keys: {', '.join(SCHEMA)}" for k in data
                 if k not in SCHEMA]
    return problems


def _check_values(data: dict) -> list[str]:
    kind, problems = data["kind"], []
    if kind not in KINDS:
        return [f"key 'kind' must be one of {sorted(KINDS)}, got {_short(kind)}"]
    if data["backend"] not in BACKENDS[kind]:
        problems.append(f"key 'backend' must be one of {sorted(BACKENDS[kind])} for a {kind} "
                        f"target, got {_short(data['backend'])}")
    listed = data.get("backends", [data["backend"]])
    problems += [f"key 'backends': {_short(b)} is not a {kind} backend (one of "
                 f"{sorted(BACKENDS[kind])})" for b in listed if b not in BACKENDS[kind]]
    if data["backend"] not in listed:
        problems.append(f"key 'backends' must include the default backend {data['backend']!r}, "
                        f"got {_short(listed)}")
    if data.get("preferred_layout", "NCHW") not in LAYOUTS:
        problems.append(f"key 'preferred_layout' must be one of {sorted(LAYOUTS)}, "
                        f"got {_short(data['preferred_layout'])}")
    paths = INT8_PATHS.get(kind, INT8_PATHS["cpu"])
    if data.get("int8", "none") not in paths:
        problems.append(f"key 'int8' must be one of {list(paths)} on a {kind} target, got "
                        f"{_short(data['int8'])}")
    if data.get("bf16", "none") not in BF16_PATHS:
        problems.append(f"key 'bf16' must be one of {list(BF16_PATHS)}, got "
                        f"{_short(data['bf16'])}")
    if data.get("winograd", "none") not in WINOGRAD_PATHS:
        problems.append(f"key 'winograd' must be one of {list(WINOGRAD_PATHS)}, got "
                        f"{_short(data['winograd'])}")
    problems += _check_numbers(data)
    for key, accepted in (("vector_bits", VECTOR_BITS), ("warp_size", WARP_SIZES)):
        if key in data and data[key] not in accepted:  # (tuning-record keys, on any kind)
            problems.append(f"key '{key}' must be one of {sorted(accepted)}, got {data[key]}")
    problems += _check_gpu(data) if kind == "gpu" else []
    for k, v in data.get("peak_tflops", {}).items():
        if k not in PEAK_DTYPES:
            problems.append(f"key 'peak_tflops.{_short(k, quote=False)}': unknown dtype; accepted: "
                            f"{', '.join(PEAK_DTYPES)}")
        elif not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
            problems.append(f"key 'peak_tflops.{_short(k, quote=False)}' must be a positive number, got {_short(v)}")
    return problems


def _check_numbers(data: dict) -> list[str]:
    return [f"key '{k}' must be >= 0, got {v}" for k, v in data.items()
            if SCHEMA[k][0][0] in (int, float) and not isinstance(v, bool) and not v >= 0]


def _check_gpu(data: dict) -> list[str]:
    problems = [f"GPU targets need key '{k}' ({SCHEMA[k][2]})" for k in GPU_REQUIRED
                if k not in data]
    pattern = GPU_ARCH.get(data["vendor"])
    if pattern and not pattern.match(data["arch"]):
        problems.append(f"key 'arch' for vendor {data['vendor']} must look like "
                        f"{pattern.pattern!r} (e.g. sm_90, gfx942), got {_short(data['arch'])}")
    return problems
