"""The non-finite guard: a run stops, naming the newest intact checkpoint, rather than
train on (or save) non-finite values."""

from __future__ import annotations

import dataclasses

from vit_jax.workdir.checkpoints import Checkpoints

SKIPPED_IN_A_ROW = 10  # with skip_nonfinite: more non-finite steps in a row stop the run


@dataclasses.dataclass
class FiniteGuard:
    """Stops the run on non-finite values; checked at every log and save step, before
    the save, so nothing non-finite is ever written over a good checkpoint.

    Without `skip`, a step whose loss, gradient norm or new state is non-finite
    ('finite' metric 0) stops the run. With `skip` (config.skip_nonfinite) such steps
    left the state unchanged inside the jitted step; the run stops only when at least
    SKIPPED_IN_A_ROW steps in a row were skipped (as far as the checks can tell: a
    window between two checks with one good step in it breaks the row). The checkpoint
    it names is the newest with a complete integrity record whose files are all there at
    their sizes (`Checkpoints.newest_intact_sentence`), never a damaged one.
    """

    checkpoints: Checkpoints
    skip: bool
    last_step: int = 0  # the step of the last check, and the skipped count then
    last_skipped: int = 0

    def __post_init__(self):
        self.row_from = self.last_step  # every step after this one was skipped

    def check(self, metrics: dict[str, float], step: int) -> None:
        skipped = int(metrics["skipped"])
        if self.skip:
            if skipped - self.last_skipped < step - self.last_step:
                self.row_from = step  # a good step since the last check
            if step - self.row_from >= SKIPPED_IN_A_ROW:
                self._stop(
                    f"steps {self.row_from + 1} to {step} all had a non-finite loss or "
                    f"gradient and were skipped (loss {metrics['loss']})"
                )
        elif not metrics["finite"]:
            since = "" if step == self.last_step + 1 else f" (it began after step {self.last_step})"
            self._stop(
                f"non-finite loss {metrics['loss']}, gradient norm {metrics['grad_norm']} or "
                f"new state at step {step}{since}; nothing non-finite was saved"
            )
        self.last_step, self.last_skipped = step, skipped

    def _stop(self, what: str) -> None:
        try:
            self.checkpoints.wait()  # a save in flight holds a checked state
        except Exception:  # noqa: BLE001 (a failed save is not the checkpoint named)
            pass
        where = self.checkpoints.newest_intact_sentence()  # whole, with its record
        raise FloatingPointError(
            f"{what}. {where}: lower the learning rate, clip gradients "
            "(config.optimizer.grad_clip) or set config.skip_nonfinite=True, and run it again"
        )
