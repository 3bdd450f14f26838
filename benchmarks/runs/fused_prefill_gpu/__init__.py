"""``fused_prefill_gpu.py``'s parts: the engines at Llama-3-8B shapes, one context, the table."""
