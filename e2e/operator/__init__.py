"""Operator tests against the real kube-apiserver harness, and the KubeRay stand-ins they use."""
