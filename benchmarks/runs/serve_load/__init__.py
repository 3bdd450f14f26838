"""``serve_load.py``'s server, which ``vllm_connector.py serve-load`` starts too."""
