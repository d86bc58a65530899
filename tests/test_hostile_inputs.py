"""What a user can get wrong, and what must still end in a clear error or a right result with
nothing lost: recompiling, inputs, parameters, checkpoints, ONNX files, the CLI, the C API."""

import numpy as np
import torch
from torch import nn

import ubitrain as ub


def test_recompiling_into_the_same_out_dir_runs_the_new_code(tmp_path):
    """The loader hands out a library a process already loaded from a path: the new trainer
    must not run the old code with the new shapes."""
    x, y = torch.randn(4, 3, 2, 2), torch.randint(0, 3, (4,))
    for width in (6, 4, 6):
        torch.manual_seed(width)
        model = nn.Sequential(nn.Flatten(), nn.Linear(12, width), nn.ReLU(), nn.Linear(width, 3))
        trainer = ub.compile(model, (x,), y, out_dir=tmp_path / "same").build()
        assert trainer.parameters()["1.weight"].shape == (width, 12)
        with torch.no_grad():
            np.testing.assert_allclose(trainer.predict(x), model(x).numpy(), rtol=1e-5,
                                       atol=1e-6)
