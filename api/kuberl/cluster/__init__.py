"""`kuberl submit | status | logs | stop | resume` and `kuberl crd --apply`: the RLJob on a cluster, through the
Kubernetes API with the kubeconfig and namespace kubectl would use.

The `kubernetes` client is imported inside the commands (it comes with `kuberl[cluster]`), so `kuberl validate`
stays light.
"""
