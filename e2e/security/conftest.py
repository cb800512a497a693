"""The security tests use the operator tests' fixtures (the RLJob CRD, a running operator)."""

from e2e.operator.conftest import kube, operator, rljob_crd, sim  # noqa: F401 (pytest fixtures)
