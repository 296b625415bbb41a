"""The chain most optimizers end with: their own steps, then the learning rate."""

from __future__ import annotations

from gradtx._combinators.chain import Chain, optimizer
from gradtx._core.protocol import Transformation
from gradtx._transforms.scale import ScalarOrSchedule, scale_by_learning_rate


def descent(label: str, learning_rate: ScalarOrSchedule, *steps: Transformation) -> Chain:
    """`optimizer(label, *steps, scale_by_learning_rate(learning_rate))`."""
    return optimizer(label, *steps, scale_by_learning_rate(learning_rate))
