"""Less-established algorithms, under the same contract as the core.

Each follows optax.contrib's name, arguments and defaults; the docstrings give the math and
the paper. Algorithms whose step size is a global quantity (`prodigy`, `dadapt_adamw`,
`dog`, `dowg`) keep it in the state as named scalars (`state["estim_lr"]`), next to the
per-path slots.
"""

from gradtx.contrib._acprop import acprop, scale_by_acprop
from gradtx.contrib._ademamix import ademamix, scale_by_ademamix
from gradtx.contrib._adopt import adopt, scale_by_adopt
from gradtx.contrib._cocob import cocob, scale_by_cocob
from gradtx.contrib._complex_split import split_real_and_imaginary
from gradtx.contrib._dadapt import dadapt_adamw
from gradtx.contrib._dog import dog, dowg, scale_by_dog, scale_by_dowg
from gradtx.contrib._dpsgd import differentially_private_aggregate, dpsgd
from gradtx.contrib._galore import GaLoreDimensionNumbers, galore, scale_by_galore
from gradtx.contrib._madgrad import madgrad, scale_by_madgrad
from gradtx.contrib._mechanic import mechanize
from gradtx.contrib._momo import momo, momo_adam
from gradtx.contrib._muon import muon, orthogonalize_via_newton_schulz, scale_by_muon
from gradtx.contrib._normalize import normalize
from gradtx.contrib._prodigy import prodigy
from gradtx.contrib._reduce_on_plateau import reduce_on_plateau
from gradtx.contrib._sam import sam
from gradtx.contrib._simplified_ademamix import scale_by_simplified_ademamix, simplified_ademamix
from gradtx.contrib._sophia import hutchinson_estimator_diag_hessian, scale_by_sophia, sophia

__all__ = [
    "GaLoreDimensionNumbers",
    "acprop",
    "ademamix",
    "adopt",
    "cocob",
    "dadapt_adamw",
    "differentially_private_aggregate",
    "dog",
    "dowg",
    "dpsgd",
    "galore",
    "hutchinson_estimator_diag_hessian",
    "madgrad",
    "mechanize",
    "momo",
    "momo_adam",
    "muon",
    "normalize",
    "orthogonalize_via_newton_schulz",
    "prodigy",
    "reduce_on_plateau",
    "sam",
    "scale_by_acprop",
    "scale_by_ademamix",
    "scale_by_adopt",
    "scale_by_cocob",
    "scale_by_dog",
    "scale_by_dowg",
    "scale_by_galore",
    "scale_by_madgrad",
    "scale_by_muon",
    "scale_by_simplified_ademamix",
    "scale_by_sophia",
    "simplified_ademamix",
    "sophia",
    "split_real_and_imaginary",
]
