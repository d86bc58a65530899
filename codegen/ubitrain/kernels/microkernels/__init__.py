"""Intrinsic micro-kernels (NEON, ...) for the hot kernels of training: Jinja templates, a
manifest of what exists per ISA, and matchers from legalized Relax ops to template parameters.
The scalar kernel printed from TIR stays the reference and the fallback for anything else."""

from .render import available, plan, render_kernel, support_sources, tile

__all__ = ["available", "plan", "render_kernel", "support_sources", "tile"]
