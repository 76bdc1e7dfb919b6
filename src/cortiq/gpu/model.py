"""What the GPU models share as models of the protocol (`cortiq.models.base`): the
device runs one sequence's feed at a time, on weights kept in their stored dtypes."""
from __future__ import annotations

from ..models.base import ModelBase


class GpuModel(ModelBase):
    """A GPU model: it writes `forward` (one sequence, one submission a token) and this
    class makes its `forward_batch` of it."""

    def matrices(self) -> list:
        """No matrices: the device's products run on the weights in their stored dtypes,
        which the activation precision ("exact", "int8", "auto") does not change, so
        `set_precision` only checks its argument."""
        return []

    def forward_batch(self, states, ids_list, wants, prompts) -> list:
        """The sequences' feeds one after the other (the device runs one at a time)."""
        return [self.forward(st, ids, want, prompt)
                for st, ids, want, prompt in zip(states, ids_list, wants, prompts)]
