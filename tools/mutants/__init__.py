"""Mutants: the generated C with one deliberate, plausible defect, to show that the referee
(ubitrain.fidelity.referee.judge) can fail. A development tool of the repository, as the
fuzzer is: nothing here is in the package.

Each mutant (defects.py) is either a rewrite of the generated `model.c` (applied when the
package is built: `mutated`, run.py) or a defect in the compile (an instrument that undoes a
legality check of a pass). A mutant that finds nothing to change in a model is "not
exercised" by it (a weight-decay defect under an optimizer without weight decay), never
counted as caught.

The int8 mutants (int8_defects.py) are rewrites of the int8 (NITI) step's C, judged
bit for bit against the numpy reference (int8_run.py), on the host or a cross target.

    python benchmarks/mutants.py        # the whole suite over the real models
    python benchmarks/mutants.py --precision int8   # over the int8 test models
    tests/test_mutants.py               # a few mutants on a small model
"""

from .defects import BASELINE, MUTANTS, Mutant, mutant
from .int8_defects import INT8_MUTANTS
from .int8_run import judge_int8_mutants
from .run import MutantResult, decide, judge_mutant, judge_mutants, mutated

__all__ = ["BASELINE", "INT8_MUTANTS", "MUTANTS", "Mutant", "MutantResult", "decide",
           "judge_int8_mutants", "judge_mutant", "judge_mutants", "mutant", "mutated"]
