"""Mutants: the generated C with one deliberate, plausible defect, to show that the referee
(ubitrain.fidelity.referee.judge) can fail. A development tool of the repository, as the
fuzzer is: nothing here is in the package.

Each mutant (defects.py) is either a rewrite of the generated `model.c` (applied when the
package is built: `mutated`, run.py) or a defect in the compile (an instrument that undoes a
legality check of a pass). A mutant that finds nothing to change in a model is "not
exercised" by it (a weight-decay defect under an optimizer without weight decay), never
counted as caught.

    python benchmarks/mutants.py        # the whole suite over the real models
    tests/test_mutants.py               # a few mutants on a small model
"""

from .defects import BASELINE, MUTANTS, Mutant, mutant
from .run import MutantResult, decide, judge_mutant, judge_mutants, mutated

__all__ = ["BASELINE", "MUTANTS", "Mutant", "MutantResult", "decide", "judge_mutant",
           "judge_mutants", "mutant", "mutated"]
