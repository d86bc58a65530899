"""hexagon-v66 has no C library: targets/hexagon-v66/ub_hexagon_libm.c brings the float maths.
Its erff, sinf, cosf and fmodf against Python's math module (float64) under qemu-hexagon,
and a model that needs erff (exact GELU) and Dropout trained on hexagon-v66 like the host."""

import math
import struct
import subprocess

import numpy as np
import pytest
import torch
from harness import require_tools

import ubitrain as ub
from ubitrain.runtime.target_build import TARGET_FILES

TARGET = "hexagon-v66"
FUNCTIONS = {"erff": 0, "sinf": 1, "cosf": 2, "fmodf": 3}
PROGRAM = r"""
#include <math.h>
#include <stdint.h>
long ub_sys_read(int fd, void *buf, unsigned long n);
long ub_sys_write(int fd, const void *buf, unsigned long n);
static float pairs[2 * 1024], out[1024];
static void read_all(void *dst, unsigned long n) {
    for (unsigned long got = 0; got < n;) {
        const long r = ub_sys_read(0, (char *)dst + got, n - got);
        if (r <= 0) ub_sys_write(2, "short read\n", 11), got = n;
        got += r > 0 ? (unsigned long)r : 0;
    }
}
int main(void) {  /* stdin: function, count (<= 1024), count (x, y) pairs; stdout: f(x[, y]) */
    uint32_t head[2];
    read_all(head, sizeof head);
    if (head[1] > 1024) return 2;
    read_all(pairs, 8ul * head[1]);
    for (uint32_t i = 0; i < head[1]; ++i) {
        const float x = pairs[2 * i], y = pairs[2 * i + 1];
        out[i] = head[0] == 0 ? erff(x) : head[0] == 1 ? sinf(x) : head[0] == 2 ? cosf(x)
                                                                       : fmodf(x, y);
    }
    ub_sys_write(1, out, 4ul * head[1]);
    return 0;
}
"""


@pytest.fixture(scope="module")
def libm(tmp_path_factory):
    require_tools(TARGET)
    work = tmp_path_factory.mktemp("hexagon_libm")
    (work / "main.c").write_text(PROGRAM)
    hexagon = TARGET_FILES / "hexagon-v66"
    subprocess.run(["clang", "--target=hexagon-unknown-linux-musl", "-mcpu=hexagonv66", "-O2",
                    "-ffreestanding", "-nostdlib", "-static", "-fuse-ld=lld",
                    "-fno-math-errno", f"-I{hexagon / 'include'}", str(work / "main.c"),
                    str(hexagon / "ub_hexagon_libm.c"), str(hexagon / "ub_hexagon_crt.c"),
                    "-o", str(work / "libm")], check=True, capture_output=True)

    def run(name, x, y=None):
        x = np.asarray(x, np.float32)
        y = np.zeros_like(x) if y is None else np.asarray(y, np.float32)
        outs = []
        for i in range(0, len(x), 1024):
            xs, ys = x[i:i + 1024], y[i:i + 1024]
            request = struct.pack("<II", FUNCTIONS[name], len(xs)) + np.stack(
                [xs, ys], 1).tobytes()
            done = subprocess.run(["qemu-hexagon", str(work / "libm")], input=request,
                                  capture_output=True, check=True)
            outs.append(np.frombuffer(done.stdout, np.float32))
        return np.concatenate(outs)

    return run


def ulps(got, want):
    """|got - want| in units of the float32 spacing at want."""
    return np.abs(got.astype(np.float64) - want) / np.spacing(np.abs(want).astype(np.float32))


def test_erff_within_a_few_ulp(libm):
    rng = np.random.default_rng(0)
    x = np.concatenate([np.linspace(-4.5, 4.5, 1801), rng.uniform(-0.01, 0.01, 200),
                        [0.0, 1e-30, -2e-4, 3.91, 3.93, np.inf, -np.inf]]).astype(np.float32)
    want = np.array([math.erf(float(v)) for v in x])
    got = libm("erff", x)
    assert ulps(got, want).max() <= 5
    assert np.isnan(libm("erff", [np.nan]))[0]


def test_sinf_and_cosf_within_two_ulp_for_moderate_arguments(libm):
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.uniform(-10, 10, 1500), rng.uniform(-1000, 1000, 500),
                        np.arange(-8, 9) * np.pi / 4]).astype(np.float32)
    for name, f in (("sinf", math.sin), ("cosf", math.cos)):
        want = np.array([f(float(v)) for v in x])
        got = libm(name, x)
        assert np.abs(got - want).max() <= 1.2e-7, name  # absolute near the zeros
        away = np.abs(want) > 0.1
        assert ulps(got[away], want[away]).max() <= 2, name
        assert np.isnan(libm(name, [np.inf, np.nan])).all()


def test_fmodf_is_exact(libm):
    rng = np.random.default_rng(2)
    x = np.concatenate([rng.normal(0, 10, 900), [0.0, -0.0, 5.0, -7.5, 1e30, 3e-39]])
    y = np.concatenate([rng.choice([0.7, -0.3, 2.5, 1e-3, 123.0, 1e-40], 900),
                        [1.0, 2.0, 5.0, 2.5, 3.0, 1e-39]])
    x, y = x.astype(np.float32), y.astype(np.float32)
    got, want = libm("fmodf", x, y), np.fmod(x, y)
    assert np.array_equal(got, want) and np.array_equal(np.signbit(got), np.signbit(want))
    assert np.isnan(libm("fmodf", [1.0, np.inf], [0.0, 1.0])).all()


class GeluDropout(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)
        self.drop = torch.nn.Dropout(0.25)

    def forward(self, x):
        return self.fc2(self.drop(torch.nn.functional.gelu(self.fc1(x))))  # erff, mask scale


def test_exact_gelu_and_dropout_train_on_hexagon_like_the_host(tmp_path):
    require_tools(TARGET)
    torch.manual_seed(0)
    model = GeluDropout()
    gen = torch.Generator().manual_seed(0)
    batches = [(torch.randn(4, 8, generator=gen), torch.randint(0, 4, (4,), generator=gen))
               for _ in range(3)]
    results = {}
    for target in ("host", TARGET):
        pkg = ub.compile(model, batches[0][:1], batches[0][1], optimizer=ub.SGD(lr=0.1),
                         target=target, out_dir=tmp_path / target)
        trainer = pkg.build(seed=3)
        try:
            results[target] = trainer.train(batches), trainer.parameters()
        finally:
            getattr(trainer, "close", lambda: None)()
    (host_losses, host_params), (losses, params) = results["host"], results[TARGET]
    assert np.abs(losses - host_losses).max() <= 1e-4 * np.abs(host_losses).max()
    for name, value in host_params.items():
        assert np.abs(params[name] - value).max() <= 1e-4 * np.abs(value).max(), name
