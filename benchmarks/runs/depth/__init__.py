"""``depth.py``'s stages: adaptive depth against every fixed top-k over real retrieval."""
