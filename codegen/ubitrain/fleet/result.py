"""What a fleet run gives back, under either engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass
class FleetResult:
    """`rounds[0]` holds the initial model's test metrics; each later entry a round's: test
    `accuracy` and `loss` (with a test set), `seconds`, `bytes_up` and `bytes_down` (what
    the round's messages carried), `clients` sampled, `failures` among them and `emulated`
    clients that replied. `central` is the same for the model trained centrally on as many
    samples (None when not asked for, or without a test set)."""

    rounds: list[dict]
    model: dict[str, np.ndarray]  # the final global model
    out_dir: Path  # checkpoints/round_NNN.npz, data/, the compiled projects, accuracy.png
    seconds: float
    central: list[dict] | None = None
    plot: Path | None = None
    strategy: object = None  # the server's strategy (simulation): `replies` by round
    setup: object = None  # the clients' FleetSetup (simulation)
    refused: list[str] = field(default_factory=list)  # SuperNodes refused (deployment)

    @property
    def accuracy(self) -> float | None:
        return self.rounds[-1].get("accuracy")

    @property
    def central_accuracy(self) -> float | None:
        return self.central[-1].get("accuracy") if self.central else None

    def summary(self, clients: int) -> str:
        """The run's last line: `fleet: N clients, R rounds, test accuracy A% (centralized
        C%)`, without what the run did not measure."""
        text = f"fleet: {clients} clients, {len(self.rounds) - 1} rounds"
        if self.accuracy is not None:
            text += f", test accuracy {100 * self.accuracy:.1f}%"
        if self.central_accuracy is not None:
            text += f" (centralized {100 * self.central_accuracy:.1f}%)"
        return text
