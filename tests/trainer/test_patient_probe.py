"""The doctor's patient probe on the run's own path: the rollout setup's services opened as the run
skeleton opens them (the rollout, then the environment's check before step 1), with a stand-in for
the Env-LLM client. The held-out cases have four yes/no findings (two yes, two no)."""

from types import SimpleNamespace

import pytest

from posttrain.agents.doctor import QA, Case, UnfaithfulPatient, doctor_instruction
from posttrain.agents.env_llm import EnvLLMReply
from posttrain.data import make_row, write_rows
from posttrain.rollout.roles import RolloutRoles
from posttrain.trainer.setup import rollout_services, rollout_setup
from tests.trainer.test_doctor_setup import doctor_config

TRAIN_CASE = Case("train-1", "I have a rash.", "A red itchy rash on my arms.", "eczema", (), (QA("Does it itch?", "Yes, a lot."),))
HELD_OUT = (
    Case("val-1", "I have a cough.", "A dry cough for a week, worse at night.", "asthma", (),
         (QA("Do you wheeze?", "Yes, when I breathe out."), QA("Do you have a fever?", "No, my temperature is normal."))),
    Case("val-2", "My head hurts.", "A throbbing headache on one side, with nausea.", "migraine", (),
         (QA("Does light bother you?", "Yes, bright light makes it worse."), QA("Did you hit your head?", "No, I did not."))),
)
ANSWERS = {pair.question: pair.answer for case in HELD_OUT for pair in case.qa}


class StandInPatient:
    """What the probe uses of the Env-LLM client: ``chat`` (each reply from ``reply(question)``),
    ``drain_metrics``; and ``close``, which the rollout calls. Records every request."""

    def __init__(self, reply):
        self.reply, self.requests, self.drained = reply, [], 0

    def chat(self, conversations):
        self.requests.append([c[-1]["content"] for c in conversations])
        return [self.reply(c[-1]["content"]) for c in conversations]

    def drain_metrics(self):
        self.drained += 1
        return {}

    def close(self):
        pass


def rows(cases):
    return [make_row("doctor", [{"role": "user", "content": doctor_instruction(c.self_report)}], c.ground_truth(),
                     "medical-consultation", c.extra_info()) for c in cases]


def open_services(tmp_path, monkeypatch, patient, *overrides, resumed=None):
    """The services a training mode opens for its rollout, opened in order; the probe's printed line."""
    import posttrain.rollout.agent as agent

    train = write_rows(rows([TRAIN_CASE] * 2), tmp_path / "train.parquet")
    val = write_rows(rows(HELD_OUT), tmp_path / "val.parquet")
    config = doctor_config(f"data.train_files=[{train}]", f"data.val_files=[{val}]", "data.train_batch_size=2",
                           "actor_rollout_ref.actor.ppo_mini_batch_size=2", f"trainer.default_local_dir={tmp_path / 'run'}",
                           "env.llm.min_faithfulness=0.8", *overrides)
    monkeypatch.setattr(agent, "open_env_llm", lambda llm_config, worker: patient)
    services = rollout_services(rollout_setup(config))
    roles = SimpleNamespace(for_rollout=lambda: RolloutRoles(actor=None))
    try:
        for service in services:
            service.open(roles, resumed)
    finally:
        for service in reversed(services):
            service.close()
    return config.env.llm.model_path


def test_a_faithful_patient_passes_and_the_run_goes_on_with_the_agreement_line(tmp_path, monkeypatch, capsys):
    patient = StandInPatient(lambda question: EnvLLMReply(ANSWERS[question], "stop"))
    model = open_services(tmp_path, monkeypatch, patient)
    assert patient.requests == [list(ANSWERS)]  # the held-out cases' findings, one batched request
    assert patient.drained == 1  # the probe's requests are not the first step's metrics
    assert (f"posttrain: the patient ({model}) agrees with its cases on 1.00 of 4 yes/no findings it answered "
            "(env.llm.min_faithfulness=0.8)") in capsys.readouterr().out


def test_a_patient_below_the_bar_refuses_the_run_naming_the_fix(tmp_path, monkeypatch):
    always_yes = StandInPatient(lambda question: EnvLLMReply("Yes.", "stop"))  # right on 2 of the 4 findings
    with pytest.raises(UnfaithfulPatient, match=r"agrees with its cases on 0\.50 of 4 yes/no findings, below "
                                                r"env\.llm\.min_faithfulness=0\.8: .*`posttrain recipe doctor`") as refused:
        open_services(tmp_path, monkeypatch, always_yes)
    assert refused.value.exit_code == 2


@pytest.mark.parametrize("why, overrides, resumed", [
    ("a resumed run was probed when it started", (), "checkpoints/global_step_1"),
    ("no bar to clear", ("env.llm.min_faithfulness=null",), None),
])
def test_no_probe_on_a_resume_or_without_a_bar(tmp_path, monkeypatch, capsys, why, overrides, resumed):
    patient = StandInPatient(lambda question: EnvLLMReply("Yes.", "stop"))
    open_services(tmp_path, monkeypatch, patient, *overrides, resumed=resumed and tmp_path / resumed)
    assert patient.requests == [] and patient.drained == 0, why
    assert "agrees with its cases" not in capsys.readouterr().out


def test_a_patient_that_answers_nothing_is_not_refused(tmp_path, monkeypatch, capsys):
    """Every reply failed (the service, not the patient's faithfulness): nothing was answered, so
    nothing is refused; the line says 0 findings answered, and the run goes on (its Env-LLM breaker,
    env.llm.stop_at_failed_fraction, judges a patient that does not answer)."""
    down = StandInPatient(lambda question: EnvLLMReply("", "error", error="connection refused"))
    model = open_services(tmp_path, monkeypatch, down)
    assert len(down.requests) == 1 and down.drained == 1
    assert (f"posttrain: the patient ({model}) agrees with its cases on 0.00 of 0 yes/no findings it answered "
            "(env.llm.min_faithfulness=0.8)") in capsys.readouterr().out
