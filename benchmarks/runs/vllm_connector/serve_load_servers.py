"""The servers of each ``serve-load`` variant: vllm serve, adarag serve, or both in front."""

from __future__ import annotations

import argparse
import json
import shutil
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

from adarag import AdaRagConfig
from adarag.engine.checkpoint import Checkpoint
from adarag.engine.vllm.launch import free_port, running_vllm_server, serve_command
from runs.serve_load.server import Server


@contextmanager
def variant_servers(variant: str, root: Path, config: AdaRagConfig, args: argparse.Namespace):
    """The servers of ``variant``; yields the URL the clients call and the start-up seconds."""
    checkpoint = Checkpoint.open(config.engine.model, config.home)
    started = time.perf_counter()
    with ExitStack() as stack:
        if variant == "adarag":
            path = _adarag_config(root, variant, config, None)
            url = stack.enter_context(_adarag_serve(path, ["--batch-decode"]))
        else:
            handoff = None if variant == "vllm" else Path("/dev/shm") / f"adarag-{root.name}"
            port = free_port()
            command = serve_command(
                checkpoint.path, port, handoff, max_model_len=args.max_model_len
            )
            log = root / f"vllm_{variant}.log"
            threads = args.threads if handoff is None else args.replica_threads or args.threads
            nice = 0 if handoff is None else args.replica_nice
            vllm_url = stack.enter_context(
                running_vllm_server(command, port, log, threads=threads, nice=nice)
            )
            url = vllm_url
            if handoff is not None:
                ratio = 1.0 if variant == "connector@1.0" else None
                path = _adarag_config(root, variant, config, ratio)
                options = ["--vllm-url", vllm_url, "--vllm-handoff", str(handoff)]
                url = stack.enter_context(_adarag_serve(path, options))
                stack.callback(shutil.rmtree, handoff, ignore_errors=True)
        yield url, time.perf_counter() - started


def _adarag_config(root: Path, variant: str, config: AdaRagConfig, ratio: float | None) -> Path:
    """The config file of ``variant``'s adarag serve, on a copy of the store as ingest left it.

    Every variant starts from the same chunk KV: no variant's write-back helps another.
    """
    store = root / f"kv_{variant}"
    shutil.copytree(root / "kv", store)
    dumped = config.model_dump(mode="json")
    dumped["cache"]["store"]["directory"] = str(store)
    if ratio is not None:  # every token computed, none rounded by the store's dtype
        for tier in ("soft", "independent"):
            dumped["cache"][tier]["recompute_ratio"] = ratio
        dumped["cache"]["store"]["storage_dtype"] = "float32"
    path = root / f"config_{variant}.json"
    path.write_text(json.dumps(dumped))
    return path


@contextmanager
def _adarag_serve(config_path: Path, options: list[str]):
    """``adarag serve`` on a free port with 16 active slots; yields its base URL."""
    with Server(config_path, ["--max-active", "16", "--max-queued", "64", *options]) as server:
        yield server.base_url.removesuffix("/v1")
