"""The fleet's figures: federated against central accuracy, bytes per round for full and
sparse updates, and what 100 simulated clients cost on this machine (seconds per round and
the peak memory of every process of the run: this one, Ray's servers and its workers).

    python benchmarks/fleet.py [--runs iid noniid sparse many int8] [--out results/fleet.json]

Each run is `ubitrain.fleet.run_fleet` on the digits demo's data and CNN (what `ubitrain
fleet` runs); the first round's seconds include starting Ray's workers, so the per-round time
is the median of the others.
"""

import argparse
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

from _results import write_json

import ubitrain as ub
from ubitrain.demo import load_data
from ubitrain.fleet import run_fleet, split_dataset
from ubitrain.zoo import DigitsCNN, DigitsCNNNiti

RUNS = {  # name: the split (clients, non_iid) and run_fleet's arguments
    "iid": dict(clients=20, rounds=8),
    "noniid": dict(clients=20, rounds=8, non_iid=0.5),
    "sparse": dict(clients=20, rounds=8, sparse=True),
    "many": dict(clients=100, rounds=4, fraction_train=1.0, local_steps=5),
    "int8": dict(clients=20, rounds=8, precision="int8"),
}


def digits_run(clients: int, non_iid: float | None = None, seed: int = 0, **kwargs):
    """`ubitrain fleet`'s run: the digits split over `clients`, the demo's CNN."""
    x_train, y_train, x_test, y_test = load_data(seed)
    shards = split_dataset(x_train, y_train, clients, non_iid, seed)
    int8 = kwargs.get("precision") == "int8"
    return run_fleet(DigitsCNNNiti if int8 else DigitsCNN, shards, (x_test, y_test),
                     optimizer=None if int8 else ub.SGD(lr=0.05, momentum=0.9), seed=seed,
                     **kwargs)


def tree_rss_bytes(root: int) -> int:
    """Resident memory of `root` and all its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf(
                "SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            pass
    return total


class PeakMemory:
    """The largest tree_rss_bytes of this process seen every half second."""

    def __enter__(self):
        self.peak, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(0.5):
            self.peak = max(self.peak, tree_rss_bytes(os.getpid()))

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS))
    parser.add_argument("--out", default="results/fleet.json")
    args = parser.parse_args()
    rows = []
    for name in args.runs:
        with tempfile.TemporaryDirectory() as tmp, PeakMemory() as memory:
            start = time.perf_counter()
            r = digits_run(**RUNS[name], out_dir=Path(tmp) / name, progress=False,
                           log=lambda line: None)
            seconds = time.perf_counter() - start
        rounds = r.rounds[1:]
        row = dict(run=name, **RUNS[name], accuracy=r.accuracy,
                   central_accuracy=r.central_accuracy,
                   bytes_up_per_round=statistics.median(m["bytes_up"] for m in rounds),
                   bytes_down_per_round=statistics.median(m["bytes_down"] for m in rounds),
                   first_round_s=rounds[0]["seconds"],
                   round_s=statistics.median(m["seconds"] for m in rounds[1:]) if len(rounds) > 1
                   else rounds[0]["seconds"],
                   total_s=seconds, peak_rss_bytes=memory.peak)
        rows.append(row)
        print(f"{name:7} {row['clients']:4} clients  accuracy {100 * row['accuracy']:5.1f}% "
              f"(central {100 * row['central_accuracy']:5.1f}%)  up/down per round "
              f"{row['bytes_up_per_round'] / 1e3:7.1f} / {row['bytes_down_per_round'] / 1e3:7.1f}"
              f" kB  round {row['round_s']:5.1f} s (first {row['first_round_s']:5.1f} s)  peak "
              f"memory {row['peak_rss_bytes'] / 2**20:6.0f} MiB  total {seconds:5.0f} s",
              flush=True)
    write_json(args.out, rows)


if __name__ == "__main__":
    main()
