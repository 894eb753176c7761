"""How many self-play worker processes keep one GPU busy: the two sides measured apart.

A worker's one search thread gathers one half-batch while the network evaluates the other, so a
process can never feed the accelerator faster than that thread (docs/accelerators.md).  Measured:
* *search side*: simulations per second of bench/selfplay.py's ``search_only`` in 1, 2, 4 ... P
  processes at once;
* *network side* (PyTorch and CUDA): positions per second of the worker's 6x96 network at batch
  sizes 256 to 4096, float32 and bfloat16, on planes already on the GPU, and in float32 with each
  batch's host copies (``gpu_positions_per_s_<N>_float32_with_copies``).  The network is a
  stand-in rebuilt in PyTorch (same arithmetic per position), since TensorFlow cannot be installed
  on the lent GPU machine.

``processes_to_fill_gpu_<N>`` = the float32 rate with copies (best batch) / one search process's
simulations a second: an estimate of how many workers one GPU serves, not a measured count.

    python bench/gpu_feed.py [--processes 16] [--seconds 10] [--skip-network]

Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _selfplay_bench():
    """bench/selfplay.py as a module (it shares the name of the selfplay package, so by path)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_selfplay", Path(__file__).with_name("selfplay.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def search_rate(board_size: int, seconds: float, seed: int) -> float:
    """Simulations per wall second of one search thread: bench/selfplay.py's search_only."""
    return _selfplay_bench().search_only(board_size, seconds, seed)[1]


def _search_worker(args):
    board_size, seconds, seed = args
    return search_rate(board_size, seconds, seed)


def search_scaling(board_size: int, seconds: float, max_processes: int) -> dict:
    """{processes: total simulations/s} for 1, 2, 4, ... max_processes at once."""
    counts, k = [], 1
    while k < max_processes:
        counts.append(k)
        k *= 2
    counts.append(max_processes)
    out = {}
    context = multiprocessing.get_context("spawn")
    for count in counts:
        with context.Pool(count) as pool:
            rates = pool.map(_search_worker, [(board_size, seconds, 100 + i) for i in range(count)])
        out[count] = round(sum(rates))
        print(
            f"search {board_size}x{board_size}: {count:2d} processes -> {out[count]:,} simulations/s "
            f"({out[count] / count:,.0f} each)",
            flush=True,
        )
    return out


def network_rate(
    board_size: int, blocks: int, filters: int, batch: int, dtype: str, seconds: float, copies: bool = False
) -> float:
    """Positions/s of the PyTorch stand-in network on the GPU (see the module docstring); ``copies``:
    each call's planes come from host memory and its outputs go back to it, as in a worker."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(filters, filters, 3, padding=1, bias=False), nn.BatchNorm2d(filters)
            self.conv2, self.bn2 = nn.Conv2d(filters, filters, 3, padding=1, bias=False), nn.BatchNorm2d(filters)

        def forward(self, x):
            y = torch.relu(self.bn1(self.conv1(x)))
            return torch.relu(x + self.bn2(self.conv2(y)))

    class Network(nn.Module):
        """model.network's shape: 3x3 stem, residual blocks, policy/value/ownership/score heads."""

        def __init__(self):
            super().__init__()
            points = board_size * board_size
            self.stem = nn.Sequential(
                nn.Conv2d(17, filters, 3, padding=1, bias=False), nn.BatchNorm2d(filters), nn.ReLU()
            )
            self.tower = nn.Sequential(*[Block() for _ in range(blocks)])
            self.policy = nn.Sequential(
                nn.Conv2d(filters, 2, 1, bias=False),
                nn.BatchNorm2d(2),
                nn.ReLU(),
                nn.Flatten(),
                nn.Linear(2 * points, points + 1),
            )
            self.value = nn.Sequential(
                nn.Conv2d(filters, 2, 1, bias=False),
                nn.BatchNorm2d(2),
                nn.ReLU(),
                nn.Flatten(),
                nn.Linear(2 * points, 64),
                nn.ReLU(),
                nn.Linear(64, 2),
            )
            self.ownership = nn.Conv2d(filters, 1, 1)

        def forward(self, x):
            x = self.tower(self.stem(x))
            return self.policy(x), self.value(x), self.ownership(x)

    kind = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    model = Network().cuda().eval().to(kind).to(memory_format=torch.channels_last)
    planes = (torch.rand(batch, 17, board_size, board_size, device="cuda") < 0.3).to(kind)
    planes = planes.contiguous(memory_format=torch.channels_last)
    host = planes.float().cpu().numpy()  # what a worker hands its network: float32 numpy planes

    def call():
        if not copies:
            return model(planes)
        x = torch.from_numpy(host).to("cuda", kind).contiguous(memory_format=torch.channels_last)
        return [out.float().cpu().numpy() for out in model(x)]

    with torch.inference_mode():
        for _ in range(5):
            call()
        torch.cuda.synchronize()
        calls, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            call()
            calls += 1
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
    return calls * batch / elapsed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--processes",
        type=int,
        default=multiprocessing.cpu_count(),
        help="most search processes at once (default: every core)",
    )
    parser.add_argument("--seconds", type=float, default=8.0, help="timed seconds per measurement")
    parser.add_argument("--skip-network", action="store_true", help="search side only (no PyTorch/CUDA)")
    args = parser.parse_args(argv)
    bench = _selfplay_bench()
    result = {"bench": "gpu_feed", "search_games": bench.SEARCH_GAMES, "search_visits": bench.SEARCH_BUDGET}
    for n in (9, 19):
        result[f"search_sims_per_s_{n}"] = search_scaling(n, args.seconds, args.processes)
    if not args.skip_network:
        import torch

        result["gpu"] = torch.cuda.get_device_name(0)
        result["network"] = "PyTorch stand-in of model.network 6x96 (not TensorFlow)"
        for n in (9, 19):
            for dtype in ("float32", "bfloat16"):
                rates = {}
                for batch in (256, 1024, 4096):
                    rates[batch] = round(network_rate(n, 6, 96, batch, dtype, args.seconds / 2))
                    print(f"network {n}x{n} 6x96 {dtype} batch {batch}: {rates[batch]:,} positions/s", flush=True)
                result[f"gpu_positions_per_s_{n}_{dtype}"] = rates
            with_copies = {}
            for batch in (256, 1024, 4096):
                with_copies[batch] = round(network_rate(n, 6, 96, batch, "float32", args.seconds / 2, copies=True))
                print(
                    f"network {n}x{n} 6x96 float32 batch {batch}, host copies included: "
                    f"{with_copies[batch]:,} positions/s",
                    flush=True,
                )
            result[f"gpu_positions_per_s_{n}_float32_with_copies"] = with_copies
            one_process = result[f"search_sims_per_s_{n}"][1]
            result[f"processes_to_fill_gpu_{n}"] = round(max(with_copies.values()) / one_process, 1)
        result["processes_to_fill_gpu_is"] = (
            "an estimate: float32 with host copies over one bare search process (docstring)"
        )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
