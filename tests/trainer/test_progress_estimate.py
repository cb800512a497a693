"""status.progress's percentage and ETA (Kubeflow TrainJob's progressPercentage / estimatedRemainingSeconds)."""

from kuberl.api.status import Progress
from kuberl.trainer.observe.status import StatusReporter, duration_summary, progress_estimate


def test_percent_and_remaining_time_come_from_the_mean_step_time_of_this_attempt():
    # resumed at step 40 at t=100 s; 10 steps in 50 s -> 5 s/step, 150 steps left
    assert progress_estimate(50, 200, (100.0, 40), 150.0) == {
        "percent_complete": 25,
        "estimated_remaining_seconds": 750,
        "estimated_remaining_time_summary": "12m30s",
    }


def test_no_time_estimate_before_a_step_of_this_attempt_and_none_without_a_total():
    assert progress_estimate(40, 200, (100.0, 40), 130.0) == {"percent_complete": 20}
    assert progress_estimate(40, None, (100.0, 0), 130.0) == {}
    assert progress_estimate(200, 200, (0.0, 0), 10.0)["percent_complete"] == 100


def test_durations_read_like_kubectl_ages():
    assert [duration_summary(s) for s in (35, 250, 7500, 0)] == ["35s", "4m10s", "2h05m", "0s"]


class FakeApi:
    def __init__(self):
        self.bodies = []

    def patch_namespaced_custom_object_status(self, group, version, namespace, plural, name, body):
        self.bodies.append(body["status"]["progress"])


def test_the_reporter_adds_the_estimate_to_what_it_patches():
    now = [0.0]
    api = FakeApi()
    reporter = StatusReporter("j", "ns", api=api, min_interval=0, clock=lambda: now[0])
    reporter.report(Progress(step=0, total_steps=10))
    now[0] = 20.0
    reporter.report(Progress(step=2, total_steps=10))
    assert api.bodies[0]["percentComplete"] == 0 and "estimatedRemainingSeconds" not in api.bodies[0]
    assert api.bodies[1]["percentComplete"] == 20 and api.bodies[1]["estimatedRemainingSeconds"] == 80
