"""Required outputs are read as the task's source reads them: tau2-bench reads an agent's
message without its commas, so ``$1,628`` communicates ``1628`` (airline task 7)."""

from __future__ import annotations

from harness.suite import Task
from harness.verifiers import required_outputs, verify


def test_tau2_reads_a_message_without_its_commas():
    assert not required_outputs("The total refund is $1,628.", ["1628"]).passed
    assert required_outputs("The total refund is $1,628.", ["1628"], ignore_commas=True).passed


def test_the_verifier_reads_tau2_tasks_as_tau2_does():
    tau2 = Task(id="7", required_outputs=["1628"], source="tau2")
    own = Task(id="own", required_outputs=["1628"])
    for task, passed in ((tau2, True), (own, False)):
        verdict = verify(
            task, actual={}, expected={}, message="Refund: $1,628.", state=None, steps=[]
        )
        assert verdict.passed is passed, task.id
