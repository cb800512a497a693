"""End-to-end tests and the harness that starts their real components (etcd, kube-apiserver, ...)."""
