"""Which failures a retry cannot fix: the one list the trainer's exit code and its status report follow.

A permanent failure (bad data, a missing model or file, a broken reward function, an invalid spec) fails the same way
on every retry, so the trainer exits with `EXIT_PERMANENT` and reports it in `status.progress.failure`; the operator
then ends the RLJob Failed without a retry. Anything else (a lost node, a Ray or NCCL error, a worker's OOM) is
transient: KubeRay retries it up to `runPolicy.backoffLimit`. Classes are named by their bases, so a subclass (a
reward timeout is a `RewardFunctionError`) is covered.
"""

from __future__ import annotations

from kuberl.api import InvalidSpec
from kuberl.api.contract import timestamp
from kuberl.api.status import Failure, FailureClass
from kuberl.trainer.checkpoint.files import CheckpointMismatch
from kuberl.trainer.checkpoint.folder import CheckpointStorageError
from kuberl.trainer.data.prompts import DataError
from kuberl.trainer.data.sources import SourceError
from kuberl.trainer.model.loading import ModelNotFoundError
from kuberl.trainer.plan.layout import PlacementError
from kuberl.trainer.rewards.functions import RewardFunctionError, RewardFunctionLoadError
from kuberl.trainer.sandboxes import LocalSandboxError
from kuberl.trainer.workers.base import NonFiniteStepsError

PERMANENT_ERRORS: tuple[type[BaseException], ...] = (
    DataError,  # unreadable or invalid prompts
    ModelNotFoundError,  # model or tokenizer path that is not there
    SourceError,  # a remote file (hf://, s3://) that cannot be fetched as named
    RewardFunctionError,  # the reward function failed on a sample or returned no score
    RewardFunctionLoadError,  # reward.function names nothing callable
    PlacementError,  # the pools cannot host the rollout layout
    InvalidSpec,  # the spec fails the rules
    CheckpointMismatch,  # another RLJob's checkpoints, a folder another run holds, a resume the changed spec refuses
    CheckpointStorageError,  # a checkpoint folder that cannot be written, or cannot hold the checkpoints kept
    NonFiniteStepsError,  # trainer.maxConsecutiveSkippedSteps non-finite steps: the same data and weights again
    LocalSandboxError,  # kuberl run: this machine cannot run the sandbox server (no isolation it can enforce)
)

MAX_CHAIN = 8  # causes followed (a Ray task error wraps the worker's exception)


def causes(exc: BaseException) -> list[BaseException]:
    """`exc` and what it wraps: Ray's `cause`, then `__cause__` / `__context__`."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain and len(chain) < MAX_CHAIN:
        chain.append(current)
        wrapped = getattr(current, "cause", None)
        current = wrapped if isinstance(wrapped, BaseException) else current.__cause__ or current.__context__
    return chain


def classify(exc: BaseException) -> Failure:
    """The failure to report for `exc`: Permanent when it, or an error it wraps, is one of PERMANENT_ERRORS."""
    permanent = next((e for e in causes(exc) if isinstance(e, PERMANENT_ERRORS)), None)
    error = permanent or exc
    return Failure(
        kind=FailureClass.PERMANENT if permanent is not None else FailureClass.TRANSIENT,
        error=type(error).__name__,
        message=str(error)[:4096],
        at=timestamp(),
    )
