"""The SM3 optimizer, on `scale_by_sm3`."""

from __future__ import annotations

from typing import Any

from gradtx._optimizers.descent import descent
from gradtx._transforms.scale import ScalarOrSchedule
from gradtx._transforms.sm3 import scale_by_sm3


def sm3(learning_rate: ScalarOrSchedule, momentum: float = 0.9, *, v_dtype: Any = None) -> Any:
    r"""SM3: AdaGrad-like steps with one accumulator per row and column instead of per element.

    `chain(scale_by_sm3(b1=momentum), scale_by_learning_rate(learning_rate))`:

    $$\theta_t = \theta_{t-1} - \eta\, m_t,\qquad
      m_t = \beta\, m_{t-1} + (1 - \beta)\, \frac{g_t}{\sqrt{a_t + \epsilon}}$$

    with $a_t$ SM3-II's running sums of squared gradients, read from the rows, columns, ... of
    each array (see `scale_by_sm3`); an $n\times m$ matrix keeps $n + m$ accumulators instead
    of AdaGrad's $nm$. The learning rate may be a schedule (optax takes a number).

    Args:
        learning_rate: a number or a schedule.
        momentum: the momentum decay $\beta$ (0 for none).
        v_dtype: dtype of the accumulators (default: the parameter's dtype).

    State:
        `mu/<path>` (momentum) and `v/<path>` (accumulators, shape `(sum(param.shape),)`);
        `schedule_count/<path>` with a schedule.

    Examples:
        >>> tx = gradtx.sm3(0.1)
        >>> state = tx.init({"w": jnp.zeros((4, 3)), "b": jnp.zeros(3)})
        >>> {k: v.shape for k, v in gradtx.state_dict(state).items()}
        {'mu/b': (3,), 'mu/w': (4, 3), 'v/b': (3,), 'v/w': (7,)}

    References:
        Anil et al., "Memory-Efficient Adaptive Optimization", NeurIPS 2019.
    """
    return descent("sm3", learning_rate, scale_by_sm3(b1=momentum, v_dtype=v_dtype))
