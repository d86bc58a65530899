"""Train a small network on scikit-learn's digits through the generated C, with the public API.

    python examples/train_digits.py
"""

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

import ubitrain as ub

BATCH = 32

digits = load_digits()
x = (digits.images.astype(np.float32) / 16.0)[:, None]  # [N, 1, 8, 8] in [0, 1]
y = digits.target.astype(np.int64)
x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, stratify=y,
                                                    random_state=0)

torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Flatten(), nn.Linear(8 * 4 * 4, 10))

# One batch fixes the compiled shapes: the step always takes exactly BATCH samples.
pkg = ub.compile(model, (x_train[:BATCH],), y_train[:BATCH], loss="cross_entropy",
                 optimizer=ub.SGD(lr=0.1, momentum=0.9), target="host",
                 out_dir="build/train_digits")
print("memory plan:", pkg.memory_plan.summary())
trainer = pkg.build(seed=0)

rng = np.random.default_rng(0)
for epoch in range(5):
    order = rng.permutation(len(x_train))
    losses = [trainer.step(x_train[idx], y_train[idx])  # the last partial batch is dropped
              for idx in (order[i:i + BATCH] for i in range(0, len(order) - BATCH + 1, BATCH))]
    # predict() also takes exactly BATCH samples: pad the last test batch with zeros.
    pad = -len(x_test) % BATCH
    x_padded = np.concatenate([x_test, np.zeros((pad, 1, 8, 8), np.float32)])
    logits = np.concatenate([trainer.predict(x_padded[i:i + BATCH])
                             for i in range(0, len(x_padded), BATCH)])[:len(x_test)]
    acc = (logits.argmax(1) == y_test).mean()
    print(f"epoch {epoch + 1}: loss {np.mean(losses):.4f}, test accuracy {100 * acc:.1f}%")

weights = trainer.parameters()  # state_dict names -> numpy arrays
model.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
