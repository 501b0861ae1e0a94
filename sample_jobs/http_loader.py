"""A CPU job whose samples come from a remote store over HTTP: each ``__getitem__`` fetches one
item (``--item-kb`` of bytes) with ``urllib`` from an HTTP server that answers every request
after ``--delay-ms`` (a store's latency: the server sleeps, it does not compute). The server is
the job's own (``http.server`` on 127.0.0.1, in a thread of the training process, started before
the DataLoader's workers), so nothing outside the machine is needed. Each worker fetches its
batch's items one after the other: one request in flight per worker, the throughput a
connection's latency allows. The model is a small MLP (``--hidden``).

Switch: ``--delay-ms 0`` removes the latency, the cause; ``--workers N`` sets DataLoader
num_workers (the requests in flight: the fix for a latency-bound store). ``--ablate`` and
``--switch-after`` flip between ``--delay-ms`` and no delay in one process.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _loop import add_ablation_arg, fit_job

FEATURES = 256


def serve(item_bytes: int) -> ThreadingHTTPServer:
    """An HTTP server on 127.0.0.1 (a free port) in a daemon thread: ``GET /item/N?delay_ms=D``
    answers ``item_bytes`` bytes after D ms."""
    payload = np.random.default_rng(0).integers(0, 256, item_bytes, dtype=np.uint8).tobytes()

    class Items(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            query = parse_qs(urlparse(self.path).query)
            delay = float(query.get("delay_ms", ["0"])[0]) / 1e3
            if delay > 0:
                time.sleep(delay)
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:  # quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Items)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True, name="http-store").start()
    return server


class RemoteDataset(Dataset):
    """Item ``i``: the bytes of ``GET /item/i`` from the store at ``url``, a few of them as
    features."""

    def __init__(self, url: str, n: int, delay_ms: float) -> None:
        self.url, self.n, self.delay_ms = url, n, delay_ms

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        with urllib.request.urlopen(f"{self.url}/item/{i}?delay_ms={self.delay_ms}",
                                    timeout=60) as response:
            raw = np.frombuffer(response.read(), dtype=np.uint8)
        x = raw[: FEATURES * (len(raw) // FEATURES)].reshape(FEATURES, -1)[:, 0]
        return torch.from_numpy(x.astype(np.float32) / 256.0), i % 10


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--delay-ms", type=float, default=25.0,
                    help="the store's latency per request; 0 removes the bottleneck")
    ap.add_argument("--item-kb", type=float, default=64.0, help="bytes of each item")
    ap.add_argument("--workers", type=int, default=2, help="DataLoader num_workers")
    ap.add_argument("--hidden", type=int, default=2048, help="MLP width: the compute part")
    add_ablation_arg(ap)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    server = serve(int(args.item_kb * 1024))
    url = f"http://127.0.0.1:{server.server_address[1]}"
    n = args.batch * args.steps

    def loader(no_delay: bool) -> DataLoader:
        data = RemoteDataset(url, n, 0.0 if no_delay else args.delay_ms)
        return DataLoader(data, batch_size=args.batch, shuffle=False,
                          num_workers=args.workers, persistent_workers=args.workers > 0)

    model = nn.Sequential(nn.Linear(FEATURES, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, 10))
    try:
        timer = fit_job(args, args.delay_ms == 0, loader, model)
    finally:
        server.shutdown()
    timer.report(job="http_loader", delay_ms=args.delay_ms, workers=args.workers)


if __name__ == "__main__":
    main()
