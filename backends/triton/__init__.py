"""Triton backend (NVIDIA and AMD GPUs): render tensor-IR kernels to Triton, compile them ahead of time, package binaries and the launch plan."""
