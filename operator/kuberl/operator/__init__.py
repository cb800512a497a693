"""The kuberl operator: kopf handlers that turn RLJobs into KubeRay RayJobs and map their status back.

Run it with `python -m kuberl.operator --all-namespaces` (see docs/operator.md). The pure parts are importable
without a cluster: `kuberl.operator.rayjob.render_rayjob`, `kuberl.operator.status.next_status`.
"""
