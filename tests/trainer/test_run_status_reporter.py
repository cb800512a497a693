"""RLJob status progress reports: rate limit, merge-patch body, and API errors that never fail a run."""

from kuberl.api.status import Progress
from kuberl.trainer.observe.status import StatusReporter


class FakeApi:
    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple] = []
        self.fail = fail

    def patch_namespaced_custom_object_status(self, group, version, namespace, plural, name, body):
        self.calls.append((group, version, namespace, plural, name, body))
        if self.fail:
            raise RuntimeError("apiserver unavailable")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_progress_is_patched_into_the_rljob_status():
    api = FakeApi()
    reporter = StatusReporter("tiny", "team", api=api, clock=Clock())
    assert reporter.report(Progress(step=3, total_steps=30, reward_mean=0.5, last_checkpoint=None))
    group, version, namespace, plural, name, body = api.calls[0]
    assert (group, version, namespace, plural, name) == ("kuberl.io", "v1alpha1", "team", "rljobs", "tiny")
    progress = body["status"]["progress"]
    assert progress["step"] == 3 and progress["totalSteps"] == 30 and progress["rewardMean"] == 0.5
    assert "lastCheckpoint" not in progress and progress["updatedAt"].endswith("Z")


def test_reports_are_rate_limited_to_one_per_interval_unless_forced():
    api, clock = FakeApi(), Clock()
    reporter = StatusReporter("tiny", "team", api=api, clock=clock, min_interval=10)
    assert reporter.report(Progress(step=1))
    clock.now += 5
    assert not reporter.report(Progress(step=2))
    assert reporter.report(Progress(step=3), force=True)
    clock.now += 10
    assert reporter.report(Progress(step=4))
    assert [c[-1]["status"]["progress"]["step"] for c in api.calls] == [1, 3, 4]


def test_api_errors_are_logged_not_raised(caplog):
    reporter = StatusReporter("tiny", "team", api=FakeApi(fail=True), clock=Clock())
    assert reporter.report(Progress(step=1)) is False
    assert reporter.failures == 1 and "status patch failed" in caplog.text


def test_reporting_is_off_outside_the_cluster(monkeypatch):
    monkeypatch.setenv("KUBERL_REPORT_STATUS", "1")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert StatusReporter.from_env("tiny", "team") is None
    monkeypatch.delenv("KUBERL_REPORT_STATUS")
    assert StatusReporter.from_env("tiny", "team") is None


class FakeCore:
    def __init__(self, fail: bool = False) -> None:
        self.events: list[tuple[str, dict]] = []
        self.fail = fail

    def create_namespaced_event(self, namespace, body):
        if self.fail:
            raise RuntimeError("forbidden")
        self.events.append((namespace, body))


def test_a_warning_event_names_the_rljob_by_uid(monkeypatch):
    monkeypatch.setenv("KUBERL_RLJOB_UID", "uid-1")
    core = FakeCore()
    reporter = StatusReporter("job", "team-a", api=FakeApi(), core=core)
    assert reporter.event("CheckpointDamaged", "global_step_4 truncated")
    ((namespace, body),) = core.events
    assert namespace == "team-a"
    assert body["involvedObject"] == {
        "apiVersion": "kuberl.io/v1alpha1",
        "kind": "RLJob",
        "name": "job",
        "namespace": "team-a",
        "uid": "uid-1",
    }
    assert (body["type"], body["reason"], body["message"]) == (
        "Warning",
        "CheckpointDamaged",
        "global_step_4 truncated",
    )


def test_a_failed_event_is_logged_not_raised(monkeypatch, caplog):
    monkeypatch.setenv("KUBERL_RLJOB_UID", "uid-1")
    assert not StatusReporter("job", "ns", api=FakeApi(), core=FakeCore(fail=True)).event("R", "m")
    assert "forbidden" in caplog.text


def test_the_rollout_engines_are_patched_alone_without_counting_as_progress():
    """A trainer waiting for rollout engines reports how many it has, but stays silent for stall detection."""
    api = FakeApi()
    reporter = StatusReporter("tiny", "team", api=api, clock=Clock())
    assert reporter.report_engines(0)
    progress = api.calls[0][-1]["status"]["progress"]
    assert progress == {"rolloutEngines": 0}  # no updatedAt: the operator's stall clock keeps running
    assert Progress.model_validate(progress).rollout_engines == 0  # the status field's own wire name
    assert StatusReporter("tiny", "team", api=FakeApi(fail=True), clock=Clock()).report_engines(1) is False
