"""Less-established algorithms, under the same contract as the core.

Each follows optax.contrib's name, arguments and defaults; the docstrings give the math and
the paper. Algorithms whose step size is a global quantity (`prodigy`, `dadapt_adamw`,
`dog`, `dowg`) keep it in the state as named scalars (`state["estim_lr"]`), next to the
per-path slots.
"""

from gradtx.contrib._ademamix import ademamix, scale_by_ademamix
from gradtx.contrib._adopt import adopt, scale_by_adopt
from gradtx.contrib._cocob import cocob, scale_by_cocob
from gradtx.contrib._dadapt import dadapt_adamw
from gradtx.contrib._dog import dog, dowg, scale_by_dog, scale_by_dowg
from gradtx.contrib._muon import muon, orthogonalize_via_newton_schulz, scale_by_muon
from gradtx.contrib._prodigy import prodigy
from gradtx.contrib._sam import sam

__all__ = [
    "ademamix",
    "adopt",
    "cocob",
    "dadapt_adamw",
    "dog",
    "dowg",
    "muon",
    "orthogonalize_via_newton_schulz",
    "prodigy",
    "sam",
    "scale_by_ademamix",
    "scale_by_adopt",
    "scale_by_cocob",
    "scale_by_dog",
    "scale_by_dowg",
    "scale_by_muon",
]
