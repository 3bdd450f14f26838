"""``kernels_gpu.py``'s parts: the timer and checks, one timing function per kernel, the table."""
