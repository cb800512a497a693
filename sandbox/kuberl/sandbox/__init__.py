"""Sandboxes for programs a policy writes: the execution server of a sandbox pod, its client, and the local runner.

Standard library and `kuberl.api` only (docs/security.md, "Sandboxes"); the jail's modules (`jail`, `linux`,
`protocol`) use the standard library alone.
"""
