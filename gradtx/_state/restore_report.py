"""What `gradtx.restore` took over from a checkpoint file, and what it did not."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any


def listing(title: str, names: Sequence[str]) -> list[str]:
    """`["title (count): a, b, ..."]` naming the first ten, or `[]` when there are none."""
    if not names:
        return []
    more = ", ..." if len(names) > 10 else ""
    return [f"{title} ({len(names)}): {', '.join(names[:10])}{more}"]


@dataclasses.dataclass(frozen=True)
class RestoreReport:
    """How a checkpoint file matched the params and the transformation it was restored into.

    Names are params paths (`enc/layers/0/w`) and `state_dict` keys (`adam/mu/enc/layers/0/w`),
    after `rename`.

    Attributes:
        params_matched: params paths taken from the file.
        params_new: params paths the file lacks; they keep `params_like`'s value.
        params_dropped: params paths of the file that `params_like` lacks.
        params_changed: params paths whose shape or dtype changed; they keep `params_like`'s
            value. `{path: (saved (shape, dtype), expected (shape, dtype))}`.
        state_matched: state keys taken from the file.
        state_new: state keys the file lacks; initialised by `tx.init`.
        state_dropped: state keys of the file that the transformation does not use.
        state_changed: state keys whose shape or dtype changed; initialised by `tx.init`.
            `{key: (saved (shape, dtype), expected (shape, dtype))}`.
        fingerprint_changed: the file was saved with a transformation (`save(..., tx=tx)`)
            whose structure or static settings differ from this one's (another chain,
            mask, flag or state dtype; not another learning rate, and not `bucketed`'s
            storage layout).
        fingerprint_changes: what differs, one line per difference, by path in the
            transformation: `chain/adamw/add_decayed_weights: mask 'a' -> '**/w'` (a
            setting), `chain/1: adamw -> lion` (another step in that place).
        verified: False when the file holds no fingerprint (saved without `tx=`), so the
            transformation it was saved with is unknown: its state keys and shapes may match
            while its mask, flags or steps differ. Such a report is never `clean`.
        metadata: the `metadata` passed to `save` (`{}` if none).
    """

    params_matched: tuple[str, ...] = ()
    params_new: tuple[str, ...] = ()
    params_dropped: tuple[str, ...] = ()
    params_changed: dict[str, tuple] = dataclasses.field(default_factory=dict)
    state_matched: tuple[str, ...] = ()
    state_new: tuple[str, ...] = ()
    state_dropped: tuple[str, ...] = ()
    state_changed: dict[str, tuple] = dataclasses.field(default_factory=dict)
    fingerprint_changed: bool = False
    fingerprint_changes: tuple[str, ...] = ()
    verified: bool = True
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def clean(self) -> bool:
        """True if everything matched and a fingerprint confirmed the transformation.

        False for a file saved without `tx=` (`verified` is False), even if it matched.
        """
        return self.verified and self.matched

    @property
    def matched(self) -> bool:
        """True if every params path and state key matched and no fingerprint differs."""
        return not (
            self.params_new
            or self.params_dropped
            or self.params_changed
            or self.state_new
            or self.state_dropped
            or self.state_changed
            or self.fingerprint_changed
        )

    def __str__(self) -> str:
        lines: list[str] = []
        for part in ("params", "state"):
            lines += listing(f"{part} new", getattr(self, f"{part}_new"))
            lines += listing(f"{part} dropped", getattr(self, f"{part}_dropped"))
            for name, (got, want) in list(getattr(self, f"{part}_changed").items())[:10]:
                lines.append(f"{part} changed: {name}: saved {got}, expected {want}")
        if self.fingerprint_changed:
            lines.append(
                "fingerprint changed: the file was saved with a transformation of another "
                "structure or static settings"
                + (":" if self.fingerprint_changes else " (another chain, mask, flag or dtype)")
            )
            lines.extend(f"  {change}" for change in self.fingerprint_changes[:10])
            if len(self.fingerprint_changes) > 10:
                lines.append(f"  ... ({len(self.fingerprint_changes) - 10} more)")
        if not self.verified:
            lines.append(
                "unverified: the file holds no fingerprint of the transformation (saved "
                "without tx=), so a change of chain, mask, flag or state dtype cannot be "
                "detected; save with gradtx.save(..., tx=tx)"
            )
        return "\n".join(lines) or "everything matched"
