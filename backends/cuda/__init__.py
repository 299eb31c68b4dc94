"""CUDA C code generation: tensor-IR kernels rendered to CUDA C (render.py) and compiled with
NVRTC to cubin and PTX on machines without a GPU (toolchain.py)."""
