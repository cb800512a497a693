"""The RLJob API (kuberl.io/v1alpha1): spec and status models, the rules table, the CRD."""

from kuberl.api.batching import BatchPlan, plan_batches
from kuberl.api.contract import API_VERSION, GROUP, KIND, PLURAL, VERSION
from kuberl.api.documents import load_documents, load_rljob
from kuberl.api.spec import RLJobSpec
from kuberl.api.status import ACTIVE_PHASES, TERMINAL_PHASES, ConditionType, Phase, RLJobStatus
from kuberl.api.validation import InvalidSpec, Issue, parse_spec, validate_document

__all__ = [
    "ACTIVE_PHASES",
    "API_VERSION",
    "GROUP",
    "KIND",
    "PLURAL",
    "TERMINAL_PHASES",
    "VERSION",
    "BatchPlan",
    "ConditionType",
    "InvalidSpec",
    "Issue",
    "Phase",
    "RLJobSpec",
    "RLJobStatus",
    "load_documents",
    "load_rljob",
    "parse_spec",
    "plan_batches",
    "validate_document",
]
